"""`lorabind extract` options after LightX2V's extractor: layer globs, rank 32 cut per layer, alpha = rank, bf16
output, pairs only, key prefix, and a JSON config the command line overrides."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open

from lorabind.runtime.cli import main
from patching_helpers import write_component_folder


@pytest.fixture
def models(tmp_path):
    torch.manual_seed(0)
    base = {"blocks.0.attn.to_q.weight": torch.randn(40, 48), "blocks.0.attn.to_q.bias": torch.randn(40),
            "blocks.0.attn.to_k.weight": torch.randn(40, 48), "blocks.0.norm.weight": torch.randn(48),
            "blocks.1.ffn.proj.weight": torch.randn(6, 48)}
    tuned = {key: value + 0.01 * torch.randn_like(value) for key, value in base.items()}
    for name, state in (("base", base), ("tuned", tuned)):
        write_component_folder(tmp_path, name, state)
    return tmp_path


SUFFIXES = (".lora_A.weight", ".lora_B.weight", ".alpha", ".diff_b", ".diff")


def _modules(tensors) -> set:
    return {next(k[: -len(s)] for s in SUFFIXES if k.endswith(s)) for k in tensors}


def _extract(models, *extra) -> dict:
    out = models / "out.safetensors"
    assert main(["extract", "--base", str(models / "base"), "--tuned", str(models / "tuned"), "--out", str(out),
                 "--overwrite", *extra]) == 0  # each call replaces the previous call's file
    with safe_open(str(out), "pt") as handle:
        return {"tensors": {k: handle.get_tensor(k) for k in handle.keys()}, "metadata": handle.metadata()}


def test_defaults_rank_32_cut_per_layer_alpha_rank_bf16_with_diffs(models):
    got = _extract(models)
    tensors = got["tensors"]
    assert got["metadata"]["extract_rank"] == "32"
    assert tensors["transformer.blocks.0.attn.to_q.lora_A.weight"].shape == (32, 48)
    assert tensors["transformer.blocks.1.ffn.proj.lora_A.weight"].shape == (6, 48)  # cut at min(out, in)
    assert tensors["transformer.blocks.0.attn.to_q.alpha"].item() == 32.0
    assert {t.dtype for k, t in tensors.items() if not k.endswith(".alpha")} == {torch.bfloat16}
    assert "transformer.blocks.0.norm.diff" in tensors and "transformer.blocks.0.attn.to_q.diff_b" in tensors


def test_layers_restrict_the_pairs_and_no_diffs_writes_pairs_only(models):
    only_q = _extract(models, "--layers", "blocks.0.attn.to_q", "--dtype", "fp32")["tensors"]
    assert _modules(only_q) == {"transformer.blocks.0.attn.to_q"} and "transformer.blocks.0.attn.to_q.diff_b" in only_q
    pairs = _extract(models, "--no-diffs")["tensors"]
    assert pairs and all(k.endswith((".lora_A.weight", ".lora_B.weight", ".alpha")) for k in pairs)
    assert _modules(pairs) == {"transformer.blocks.0.attn.to_q", "transformer.blocks.0.attn.to_k",
                               "transformer.blocks.1.ffn.proj"}


def test_config_file_with_command_line_overrides_and_key_prefix(models):
    config = models / "extract.json"
    config.write_text(json.dumps({"rank": 4, "layers": ["blocks.0.*"], "diffs": False, "key_prefix": ""}))
    got = _extract(models, "--config", str(config), "--rank", "2", "--no-alpha")
    tensors = got["tensors"]
    assert got["metadata"]["extract_rank"] == "2"
    assert set(tensors) == {"blocks.0.attn.to_q.lora_A.weight", "blocks.0.attn.to_q.lora_B.weight",
                            "blocks.0.attn.to_k.lora_A.weight", "blocks.0.attn.to_k.lora_B.weight"}
    assert tensors["blocks.0.attn.to_q.lora_A.weight"].shape == (2, 48)


def test_unknown_config_keys_are_refused_naming_them(models, capsys):
    config = models / "bad.json"
    config.write_text(json.dumps({"rank": 4, "lora_rank": 8}))
    assert main(["extract", "--base", str(models / "base"), "--tuned", str(models / "tuned"), "--out",
                 str(models / "x.safetensors"), "--config", str(config)]) == 1
    assert "unknown key 'lora_rank'" in capsys.readouterr().err


def test_a_lightx2v_extractor_yaml_config_extracts_and_what_we_do_not_reproduce_is_refused_by_name(models, capsys):
    """LightX2V's extractor keys (source_model, target_model, output, rank, output_dtype) read as ours; a value
    lorabind does not reproduce (diff_only: true, a pickle source) is refused naming the key."""
    out = models / "from_yaml.safetensors"
    config = models / "extract.yaml"
    text = (f"source_model: {models / 'base'}\ntarget_model: {models / 'tuned'}\noutput: {out}\nrank: 3\n"
            "output_dtype: float32\nsource_type: safetensors\ndiff_only: false\n")
    config.write_text(text)
    assert main(["extract", "--config", str(config)]) == 0
    with safe_open(str(out), "pt") as handle:
        pair = handle.get_tensor("transformer.blocks.0.attn.to_q.lora_A.weight")
        assert handle.metadata()["extract_rank"] == "3"
    assert pair.shape == (3, 48) and pair.dtype == torch.float32
    for line, refused in (("diff_only: true", "'diff_only: True' is not supported"),
                          ("target_type: pytorch", "'target_type: pytorch' is not supported"),
                          ("lora_alpha: 8", "LightX2V's 'lora_alpha' is not supported")):
        config.write_text(text.replace("diff_only: false", line) if "diff" in line else text + line + "\n")
        assert main(["extract", "--config", str(config), "--overwrite"]) == 1
        assert refused in capsys.readouterr().err, line
    config.write_text("rank: 3\n")
    assert main(["extract", "--config", str(config)]) == 1
    assert "give --base (on the command line or in --config)" in capsys.readouterr().err


def test_layers_that_match_no_module_say_so_instead_of_identical(models, capsys):
    out = models / "never.safetensors"
    assert main(["extract", "--base", str(models / "base"), "--tuned", str(models / "tuned"), "--out", str(out),
                 "--layers", "blocks.*.attn1.to_q"]) == 1
    err = capsys.readouterr().err
    assert "--layers ['blocks.*.attn1.to_q'] match no module of the component" in err
    assert "blocks.0.attn.to_k" in err and "identical" not in err and not out.exists()
