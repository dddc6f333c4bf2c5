"""Model folders: pickle weights are refused naming the file, and every library load is safetensors-only."""

from __future__ import annotations

import json

import pytest

from lorabind.loaders.errors import ModelLoadError
from lorabind.loaders.models import store as model_store


def _wan_folder(root, weights: dict) -> str:
    folder = root / "wan"
    folder.mkdir()
    (folder / "model_index.json").write_text(json.dumps({
        "_class_name": "WanPipeline", "transformer": ["diffusers", "WanTransformer3DModel"],
        "vae": ["diffusers", "AutoencoderKLWan"], "scheduler": ["diffusers", "UniPCMultistepScheduler"]}))
    for name, files in weights.items():
        (folder / name).mkdir()
        for file in files:
            (folder / name / file).write_bytes(b"\x80\x04weights")
    return str(folder)


def test_a_component_with_only_pickle_weights_is_refused_naming_the_file(tmp_path, monkeypatch):
    import diffusers

    calls = []
    monkeypatch.setattr(diffusers.DiffusionPipeline, "from_pretrained", lambda *a, **k: calls.append(k))
    folder = _wan_folder(tmp_path, {"transformer": ["config.json", "diffusion_pytorch_model.bin"],
                                    "vae": ["diffusion_pytorch_model.safetensors"]})
    with pytest.raises(ModelLoadError, match=r"wan/transformer/diffusion_pytorch_model.bin: pickle weights"):
        model_store.load_model(folder)
    assert calls == []  # refused before the library saw the folder


def test_libraries_are_asked_for_safetensors_only(tmp_path, monkeypatch):
    import diffusers

    seen = {}

    def fake_from_pretrained(path, **kwargs):
        seen.update(kwargs)
        raise OSError("stop here")

    monkeypatch.setattr(diffusers.DiffusionPipeline, "from_pretrained", fake_from_pretrained)
    folder = _wan_folder(tmp_path, {"transformer": ["diffusion_pytorch_model.safetensors",
                                                    "diffusion_pytorch_model.bin"]})
    with pytest.raises(ModelLoadError, match="stop here"):
        model_store.load_model(folder)
    assert seen["use_safetensors"] is True and seen["local_files_only"] is True
