"""Parallel shard loading: diffusers' thread pool with our worker count, only inside the block, same weights."""

import pytest
import torch

from lorabind.loaders.models.parallel_loading import parallel_loading_available, shard_loading

pytestmark = pytest.mark.skipif(not parallel_loading_available(), reason="diffusers without parallel loading")


def test_worker_count_applies_inside_the_block_only_and_loads_the_same_weights(tmp_path, monkeypatch):
    from diffusers import WanTransformer3DModel
    from diffusers.models import model_loading_utils, modeling_utils

    torch.manual_seed(0)
    WanTransformer3DModel(patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=8, in_channels=4,
                          out_channels=4, text_dim=8, freq_dim=16, ffn_dim=16, num_layers=4).save_pretrained(
        tmp_path, max_shard_size="8KB")
    shards = len(list(tmp_path.glob("*.safetensors")))
    pools = []
    real_pool = modeling_utils._load_shard_files_with_threadpool

    def spy(*args, **kwargs):
        pools.append(model_loading_utils.DEFAULT_HF_PARALLEL_LOADING_WORKERS)
        return real_pool(*args, **kwargs)

    monkeypatch.setattr(modeling_utils, "_load_shard_files_with_threadpool", spy)
    before = (modeling_utils.HF_ENABLE_PARALLEL_LOADING, model_loading_utils.DEFAULT_HF_PARALLEL_LOADING_WORKERS)
    with shard_loading(1) as used:
        sequential = WanTransformer3DModel.from_pretrained(str(tmp_path), torch_dtype=torch.bfloat16)
    assert used == 1 and pools == []
    with shard_loading(3) as used:
        assert modeling_utils.HF_ENABLE_PARALLEL_LOADING is True
        parallel = WanTransformer3DModel.from_pretrained(str(tmp_path), torch_dtype=torch.bfloat16)
    assert used == 3 and pools == [3] and shards > 3
    assert (modeling_utils.HF_ENABLE_PARALLEL_LOADING,
            model_loading_utils.DEFAULT_HF_PARALLEL_LOADING_WORKERS) == before
    a, b = sequential.state_dict(), parallel.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert any(t.abs().sum() > 0 for t in a.values())


def test_load_model_takes_the_worker_count_from_its_argument_or_the_environment(tiny_models_root, tmp_path,
                                                                               monkeypatch):
    import shutil

    from diffusers import WanTransformer3DModel
    from diffusers.models import model_loading_utils, modeling_utils

    from lorabind.loaders.errors import ModelLoadError
    from lorabind.loaders.models import store as model_store

    folder = tmp_path / "sharded-wan21"
    shutil.copytree(tiny_models_root / "diffusers" / "tiny-wan21-t2v", folder)
    transformer = WanTransformer3DModel.from_pretrained(folder / "transformer")
    shutil.rmtree(folder / "transformer")
    transformer.save_pretrained(folder / "transformer", max_shard_size="20KB")
    assert len(list((folder / "transformer").glob("*.safetensors"))) > 2
    pools = []
    real_pool = modeling_utils._load_shard_files_with_threadpool
    monkeypatch.setattr(modeling_utils, "_load_shard_files_with_threadpool", lambda *a, **k: (
        pools.append(model_loading_utils.DEFAULT_HF_PARALLEL_LOADING_WORKERS), real_pool(*a, **k))[1])

    model_store.clear_cache()
    monkeypatch.setenv("LORABIND_LOAD_WORKERS", "1")
    sequential = model_store.load_model(folder).components["transformer"].state_dict()
    assert pools == []
    model_store.clear_cache()
    parallel = model_store.load_model(folder, load_workers=3).components["transformer"].state_dict()
    assert pools and set(pools) == {3}  # every diffusers model of the pipeline (transformer, VAE) used the pool
    assert all(torch.equal(sequential[k], parallel[k]) for k in sequential)
    model_store.clear_cache()
    monkeypatch.setenv("LORABIND_LOAD_WORKERS", "2")
    used = len(pools)
    model_store.load_model(folder)
    assert set(pools[used:]) == {2} and len(pools) == 2 * used
    model_store.clear_cache()
    monkeypatch.setenv("LORABIND_LOAD_WORKERS", "many")
    with pytest.raises(ModelLoadError, match="LORABIND_LOAD_WORKERS='many' is not a whole number"):
        model_store.load_model(folder)
    model_store.clear_cache()


def test_without_a_worker_count_the_loader_takes_one_per_core_and_one_on_a_rotating_disk(tiny_models_root,
                                                                                        monkeypatch):
    from lorabind.loaders.models import diffusers_folder, parallel_loading

    folder = tiny_models_root / "diffusers" / "tiny-wan21-t2v"
    assert parallel_loading.on_rotating_disk(folder / "does-not-exist") is None
    assert 1 <= parallel_loading.usable_cores()
    monkeypatch.delenv("LORABIND_LOAD_WORKERS", raising=False)
    monkeypatch.setattr(parallel_loading, "on_rotating_disk", lambda path: None)
    for cores, want in ((1, 1), (2, 2), (6, 6), (64, parallel_loading.MAX_WORKERS)):
        monkeypatch.setattr(parallel_loading, "usable_cores", lambda cores=cores: cores)
        assert diffusers_folder.default_load_workers(folder) == want
    monkeypatch.setattr(parallel_loading, "on_rotating_disk", lambda path: True)
    monkeypatch.setattr(parallel_loading, "cached_fraction", lambda files: 0.0)  # the shards are on the disk
    assert diffusers_folder.default_load_workers(folder) == 1
    monkeypatch.setenv("LORABIND_LOAD_WORKERS", "3")
    assert diffusers_folder.default_load_workers(folder) == 3


def test_inside_inference_mode_the_shards_load_on_this_thread():
    """ComfyUI runs every node under torch.inference_mode, which diffusers' pool threads do not inherit: a
    parameter made there of this thread's tensors fails, so the load stays sequential inside the mode."""
    import torch

    from lorabind.loaders.models.parallel_loading import parallel_loading_available, shard_loading

    if not parallel_loading_available():
        pytest.skip("this diffusers has no shard thread pool")
    with shard_loading(4) as outside:
        pass
    with torch.inference_mode(), shard_loading(4) as inside:
        pass
    assert (outside, inside) == (4, 1)


def test_a_load_inside_inference_mode_never_asks_the_worker_rule(tiny_models_root, monkeypatch):
    """Inside ComfyUI (inference mode) the shards load on one thread whatever the rule says, so the rule's page-cache
    question (a map of every weight file) is not asked there; outside it is."""
    from lorabind.loaders.models import diffusers_folder

    if not parallel_loading_available():
        pytest.skip("this diffusers has no shard thread pool")
    asked = []
    monkeypatch.setattr(diffusers_folder, "auto_workers", lambda folder: asked.append(folder) or 1)
    source = diffusers_folder.DiffusersFolder(tiny_models_root / "diffusers" / "tiny-wan21-t2v")
    with torch.inference_mode():
        source.build(None)
    assert asked == []
    source.build(None)
    assert len(asked) == 1
