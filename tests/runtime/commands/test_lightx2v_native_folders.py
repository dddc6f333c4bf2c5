"""Issue 59 item 5: the LightX2V guide's merge and extract commands, typed as its docs print them, on tiny stand-ins
of its native inputs: a release's ``high_noise_model/`` folder (native key names in safetensors shards, a
``config.json`` naming the release's own ``WanModel``, no ``model_index.json``) and a standalone diffusers
``transformer/`` folder. Both were refused ("model_index.json: not found"). The folder merges as the one file it was
split from merges, bit for bit; its converter flags (``--source-type``, ``--lora-type``, ``--output-format``) are
taken for safetensors and refused with the pickle message for pytorch, as is a ``.pt`` model."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from lorabind.runtime.cli import main
from lorabind.tiny_models.lora_fixtures import WAN22_HIGH

NATIVE_FILE = "wan2.2_t2v_high_noise_tiny_bf16.safetensors"


def _tensors(path) -> dict:
    with safe_open(str(path), "pt") as handle:
        return {key: handle.get_tensor(key) for key in handle.keys()}


def _same(first, second) -> bool:
    a, b = _tensors(first), _tensors(second)
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _shard(tensors: dict, folder, stem: str, parts: int = 2) -> None:
    """``tensors`` split into ``parts`` shards with their index, as the releases ship them."""
    folder.mkdir(parents=True)
    keys = sorted(tensors)
    index = {"metadata": {}, "weight_map": {}}
    for part in range(parts):
        name = f"{stem}-{part + 1:05d}-of-{parts:05d}.safetensors"
        chunk = keys[part::parts]
        save_file({key: tensors[key].contiguous() for key in chunk}, str(folder / name))
        index["weight_map"].update(dict.fromkeys(chunk, name))
    (folder / f"{stem}.safetensors.index.json").write_text(json.dumps(index))


@pytest.fixture(scope="module")
def release(tiny_models_root, tmp_path_factory):
    """``Wan2.2-T2V-A14B/high_noise_model/`` (native shards) and a lone diffusers ``transformer/`` (sharded too),
    beside the single file and the diffusers folder they were made from."""
    from lorabind.tiny_models.single_files import write_tiny_single_files

    write_tiny_single_files(tiny_models_root)
    root = tmp_path_factory.mktemp("lightx2v_release")
    single = tiny_models_root / "diffusion_models" / "lorabind-tiny" / NATIVE_FILE
    _shard(load_file(str(single)), root / "Wan2.2-T2V-A14B" / "high_noise_model", "diffusion_pytorch_model")
    (root / "Wan2.2-T2V-A14B" / "high_noise_model" / "config.json").write_text(
        json.dumps({"_class_name": "WanModel", "model_type": "t2v", "dim": 24, "num_heads": 2}))
    diffusers = tiny_models_root / "diffusers" / "tiny-wan22-t2v" / "transformer"
    _shard(load_file(str(diffusers / "diffusion_pytorch_model.safetensors")), root / "transformer",
           "diffusion_pytorch_model")
    shutil.copy(diffusers / "config.json", root / "transformer" / "config.json")
    return {"root": root, "single": single, "native": root / "Wan2.2-T2V-A14B" / "high_noise_model",
            "component": root / "transformer", "lora": tiny_models_root / "loras" / WAN22_HIGH,
            "diffusers": tiny_models_root / "diffusers" / "tiny-wan22-t2v"}


def test_the_guides_merge_of_a_native_shard_folder_is_the_merge_of_its_single_file(release, tmp_path):
    typed = ["merge", "--source-model", str(release["native"]), "--lora-model", str(release["lora"]), "--output",
             str(tmp_path / "merged" / "model.safetensors"), "--alpha", "1.0"]
    assert main(typed) == 0
    assert main(["merge", "--model", str(release["single"]), "--lora", str(release["lora"]), "--out",
                 str(tmp_path / "from_file.safetensors")]) == 0
    assert _same(tmp_path / "merged" / "model.safetensors", tmp_path / "from_file.safetensors")


def test_the_guides_extract_reads_a_native_shard_folder(release, tmp_path):
    merged = tmp_path / "merged.safetensors"
    assert main(["merge", "--model", str(release["single"]), "--lora", str(release["lora"]), "--out", str(merged)]) == 0
    typed = ["extract", "--source-model", str(release["native"]), "--target-model", str(merged), "--output",
             str(tmp_path / "extracted.safetensors"), "--rank", "32"]
    assert main(typed) == 0
    assert main(["extract", "--base", str(release["single"]), "--tuned", str(merged), "--out",
                 str(tmp_path / "from_file.safetensors"), "--rank", "32"]) == 0
    assert _same(tmp_path / "extracted.safetensors", tmp_path / "from_file.safetensors")


def test_a_lone_transformer_folder_merges_as_the_diffusers_folder_merges_it(release, tmp_path):
    typed = ["merge", "--source-model", str(release["component"]), "--source-type", "safetensors", "--lora-model",
             str(release["lora"]), "--lora-type", "safetensors", "--output", str(tmp_path / "model.safetensors"),
             "--output-format", "safetensors"]
    assert main(typed) == 0
    assert main(["merge", "--model", str(release["diffusers"]), "--lora", f"transformer={release['lora']}", "--out",
                 str(tmp_path / "folder")]) == 0
    merged = _tensors(tmp_path / "model.safetensors")
    folder = load_file(str(tmp_path / "folder" / "transformer" / "diffusion_pytorch_model.safetensors"))
    assert merged.keys() == folder.keys() and all(torch.equal(merged[k], folder[k]) for k in merged)


def test_a_lone_transformer_folder_and_its_merge_extract_against_each_other_and_the_native_folder(release, tmp_path):
    merged = tmp_path / "model.safetensors"
    assert main(["merge", "--source-model", str(release["component"]), "--lora-model", str(release["lora"]),
                 "--output", str(merged)]) == 0
    for base in (release["component"], release["native"]):  # diffusers names on both sides, or native on one
        out = tmp_path / f"{base.name}.safetensors"
        assert main(["extract", "--source-model", str(base), "--target-model", str(merged), "--output", str(out),
                     "--rank", "4"]) == 0
        assert any(key.endswith(".lora_A.weight") for key in _tensors(out))


@pytest.mark.parametrize("argv, words", [
    (["merge", "--source-type", "pytorch"], "--source-type pytorch: lorabind reads safetensors only; pickle"),
    (["merge", "--lora-type", "pytorch"], "--lora-type pytorch: lorabind reads safetensors only; pickle"),
    (["merge", "--output-format", "pytorch"], "--output-format pytorch: lorabind writes safetensors only; pickle"),
    (["extract", "--target-type", "pytorch"], "--target-type pytorch: lorabind reads safetensors only; pickle"),
])
def test_the_converters_pytorch_format_is_refused_with_the_pickle_message(argv, words, tmp_path, capsys):
    command, *flags = argv
    paths = (["--source-model", "a", "--lora-model", "b"] if command == "merge"
             else ["--source-model", "a", "--target-model", "b"])
    assert main([command, *paths, "--output", str(tmp_path / "o.safetensors"), *flags]) == 1
    assert f"lorabind {command}: refused: {words} checkpoints (.pt, .pth) are refused" in capsys.readouterr().err


def test_a_pt_model_or_a_shard_folder_holding_one_is_refused_with_the_pickle_message(release, tmp_path, capsys):
    pt = tmp_path / "model.pt"
    pt.write_bytes(b"not unpickled")
    assert main(["merge", "--source-model", str(pt), "--lora-model", str(release["lora"]), "--output",
                 str(tmp_path / "o.safetensors")]) == 1
    assert "model.pt: only .safetensors single files and .gguf denoisers are read (pickle formats are refused)" in \
        capsys.readouterr().err
    folder = tmp_path / "high_noise_model"
    shutil.copytree(release["native"], folder)
    (folder / "diffusion_pytorch_model.pth").write_bytes(b"not unpickled")
    assert main(["extract", "--source-model", str(folder), "--target-model", str(release["single"]), "--output",
                 str(tmp_path / "x.safetensors")]) == 1
    assert ("high_noise_model/diffusion_pytorch_model.pth: pickle checkpoints are refused because loading them can "
            "run arbitrary code") in capsys.readouterr().err
