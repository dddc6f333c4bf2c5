"""``lorabind inspect --model`` accounts against the model's structure (parameter names and shapes from the
weight files' safetensors headers, as meta tensors): no weight is read, and the accounting is the one the engine
computes on the loaded model."""

from __future__ import annotations

import json
import shutil
import struct

import pytest

from lorabind.loaders.families import family_by_id
from lorabind.loaders.models import store as model_store
from lorabind.runtime.cli import main
from lorabind.tiny_models import lora_fixtures as F


@pytest.fixture
def models_root(tiny_models_root):
    return tiny_models_root


def headers_only(source, target):
    """The model folder with every weight byte after the safetensors headers overwritten by 0xFF (NaN in every
    float dtype): the structure is still there, any weight value that were read would be garbage."""
    shutil.copytree(source, target)
    for weights in target.rglob("*.safetensors"):
        data = bytearray(weights.read_bytes())
        (header_len,) = struct.unpack("<Q", data[:8])
        data[8 + header_len:] = b"\xff" * (len(data) - 8 - header_len)
        weights.write_bytes(bytes(data))
    return target


def test_inspect_model_reads_no_weight_and_accounts_like_the_engine(models_root, tmp_path, monkeypatch, capsys):
    from lorabind.loaders.lora import account, map_to_model, read_lora

    full = models_root / "diffusers" / "tiny-wan22-t2v"
    lora = str(models_root / "loras" / F.WAN22_LOW)
    loaded = model_store.load_model(str(full))
    expected = account(map_to_model(read_lora(lora), loaded.family, family_by_id(loaded.family)), loaded.components["transformer_2"],
                       component="transformer_2").to_dict()

    def no_pipeline(*args, **kwargs):
        raise AssertionError("inspect --model loaded the pipeline")

    monkeypatch.setattr(model_store, "load_model", no_pipeline)
    folder = headers_only(full, tmp_path / "tiny-wan22-t2v")
    assert main(["inspect", lora, "--model", str(folder), "--json"]) == 0
    accounting = json.loads(capsys.readouterr().out)["accounting"]
    assert accounting["component"] == "transformer_2" and accounting["model_family"] == "wan2.2_moe"
    assert accounting["counts"] == expected["counts"] and accounting["counts"]["applied"] > 0
    assert (accounting["modules"], accounting["unmatched"]) == (expected["modules"], expected["unmatched"])


def test_the_structure_is_on_the_meta_device(models_root):
    from lorabind.loaders.models.structure import load_structure

    structure = load_structure(models_root / "diffusers" / "tiny-wan22-t2v")
    assert sorted(structure.components) == ["transformer", "transformer_2"]
    tensors = [t for module in structure.components.values() for t in (*module.parameters(), *module.buffers())]
    assert tensors and {t.device.type for t in tensors} == {"meta"}
