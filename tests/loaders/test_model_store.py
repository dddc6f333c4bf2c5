"""load_model caching and family detection."""

import json
import os
import shutil

import pytest
import torch

from engine_probes import load_count
from lorabind.loaders.errors import ModelLoadError
from lorabind.loaders.models.store import detect_family, load_model


def test_second_load_returns_the_same_object_and_loads_once(tiny_models_root, tmp_path):
    folder = tmp_path / "wan21"
    shutil.copytree(tiny_models_root / "diffusers" / "tiny-wan21-t2v", folder)
    first = load_model(folder, name="wan21")
    second = load_model(str(folder) + "/", name="other name, same folder")
    assert second is first
    assert load_count(folder) == 1
    assert first.pipeline.transformer is first.components["transformer"]


def test_a_rebuilt_folder_is_loaded_again(tiny_models_root, tmp_path):
    folder = tmp_path / "wan21"
    shutil.copytree(tiny_models_root / "diffusers" / "tiny-wan21-t2v", folder)
    first = load_model(folder)
    index = folder / "model_index.json"
    stat = index.stat()
    os.utime(index, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
    second = load_model(folder)
    assert second is not first
    assert load_count(folder) == 2


@pytest.mark.parametrize("name, family, components", [
    ("tiny-wan22-t2v", "wan2.2_moe", ["transformer", "transformer_2"]),
    ("tiny-wan21-t2v", "wan2.1", ["transformer"]),
    ("tiny-qwen-image", "qwen_image", ["transformer"]),
])
def test_family_and_denoiser_components(load_tiny, name, family, components):
    model = load_tiny(name)
    assert model.family == family
    assert sorted(model.components) == components
    assert all(isinstance(m, torch.nn.Module) and not m.training for m in model.components.values())
    assert model.name == name and model.model_index["_class_name"] in ("WanPipeline", "QwenImagePipeline")


def test_detect_family_from_model_index_dicts():
    assert detect_family({"_class_name": "WanPipeline", "transformer": ["diffusers", "X"],
                          "transformer_2": [None, None]}) == "wan2.1"
    assert detect_family({"_class_name": "WanPipeline", "transformer_2": ["diffusers", "X"]}) == "wan2.2_moe"
    assert detect_family({"_class_name": "QwenImagePipeline"}) == "qwen_image"
    assert detect_family({"_class_name": "MiniMaxH3Pipeline"}) == "minimax_h3"
    with pytest.raises(ModelLoadError, match="FluxPipeline"):
        detect_family({"_class_name": "FluxPipeline"})


def test_dtype_is_applied_and_cached_separately(tiny_models_root):
    folder = tiny_models_root / "diffusers" / "tiny-wan21-t2v"
    bf16 = load_model(folder, dtype="bfloat16")
    assert bf16.components["transformer"].dtype == torch.bfloat16
    assert load_model(folder, dtype=torch.bfloat16) is bf16
    assert load_model(folder) is not bf16
    with pytest.raises(ModelLoadError, match="float8"):
        load_model(folder, dtype="float8")


def test_auto_dtype_loads_each_component_as_its_files_store_it(tiny_models_root, tmp_path):
    from safetensors.torch import load_file, save_file

    folder = tmp_path / "wan21"
    shutil.copytree(tiny_models_root / "diffusers" / "tiny-wan21-t2v", folder)
    for file in (folder / "transformer").glob("*.safetensors"):  # a bf16 denoiser beside a float32 VAE
        save_file({k: v.to(torch.bfloat16) for k, v in load_file(file).items()}, file)
    model = load_model(folder, dtype="auto")
    assert model.components["transformer"].dtype == torch.bfloat16  # diffusers alone would load it in float32
    assert model.pipeline.vae.dtype == torch.float32


def test_missing_folder_names_the_file(tmp_path):
    with pytest.raises(ModelLoadError, match="model_index.json"):
        load_model(tmp_path / "nothing-here")
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "model_index.json").write_text(json.dumps({"_class_name": "WanPipeline"}))
    with pytest.raises(ModelLoadError, match="broken"):
        load_model(tmp_path / "broken")


def test_a_failing_load_names_the_model_and_its_files_relative_never_by_absolute_path(tiny_models_root, tmp_path):
    """The message reaches the browser and /history (inside ComfyUI too): the folder by its model name."""
    folder = shutil.copytree(tiny_models_root / "diffusers" / "tiny-wan21-t2v", tmp_path / "broken-wan21")
    (folder / "transformer" / "diffusion_pytorch_model.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(ModelLoadError) as caught:
        load_model(folder, name="team/broken-wan21")
    message = str(caught.value)
    assert message.startswith("team/broken-wan21: cannot load the wan2.1 pipeline: ")
    assert "team/broken-wan21/transformer/diffusion_pytorch_model.safetensors" in message
    assert str(tmp_path) not in message and "/tmp" not in message


@pytest.fixture
def fresh_store(monkeypatch):
    """The model store's cache state, swapped for an empty one for one test (lifetime mode included)."""
    import weakref

    from lorabind.loaders.models import store as model_store

    monkeypatch.setattr(model_store, "_cache", weakref.WeakValueDictionary())
    monkeypatch.setattr(model_store, "_kept", {})
    monkeypatch.setattr(model_store, "_host_owns_lifetime", False)
    return model_store


def _stand_in_model(name):
    from lorabind.loaders.models.store import LoadedModel

    return LoadedModel(path=f"/models/{name}", name=name, family="wan2.1", pipeline=None)


def test_headless_the_store_keeps_models_until_it_is_cleared(fresh_store):
    import gc

    fresh_store.load_shared(("/models/a", 1), lambda: _stand_in_model("a"))
    gc.collect()
    assert [m.name for m in fresh_store.loaded_models()] == ["a"]
    fresh_store.clear_cache()
    assert fresh_store.loaded_models() == []


def test_when_the_host_owns_lifetime_a_model_lives_as_long_as_a_handle_holds_it(fresh_store):
    """Inside ComfyUI: its "Free model and node cache" drops the cached handles, and that frees our models."""
    import gc

    kept_from_before = fresh_store.load_shared(("/models/a", 1), lambda: _stand_in_model("a"))
    fresh_store.follow_host_node_cache()
    held = fresh_store.load_shared(("/models/b", 1), lambda: _stand_in_model("b"))
    assert fresh_store.load_shared(("/models/b", 1), lambda: _stand_in_model("b again")) is held  # still shared
    gc.collect()
    assert sorted(m.name for m in fresh_store.loaded_models()) == ["a", "b"]
    del kept_from_before
    gc.collect()
    assert [m.name for m in fresh_store.loaded_models()] == ["b"]
    del held
    gc.collect()
    assert fresh_store.loaded_models() == []
    assert fresh_store.load_shared(("/models/b", 1), lambda: _stand_in_model("b reloaded")).name == "b reloaded"


@pytest.mark.parametrize("header, expected", [
    (b"[1, 2]", {}),  # not a table
    (b"[" * 5000, {}),  # nested past the JSON depth bound
    (b'{"w": {"dtype": "BF16", "data_offsets": "x"}}', {"vae": "bfloat16"}),  # its dtype counts, its bytes do not
])
def test_a_malformed_weight_header_is_read_as_far_as_it_can_be_never_raising(tmp_path, header, expected):
    from lorabind.loaders.placement.load_plan import stored_dtypes

    (tmp_path / "vae").mkdir()
    (tmp_path / "vae" / "diffusion_pytorch_model.safetensors").write_bytes(len(header).to_bytes(8, "little") + header)
    assert stored_dtypes(tmp_path, {"vae": ["diffusers", "AutoencoderKLWan"]}) == expected
