"""Issue 44 item 6: the guides' flag names, typed as the guides print them. LightX2V's merger and extractor flags
are aliases of ours (the same outputs as our spellings), vllm-omni's serve flags set what they mean or are
refused in one line naming ours, and ``lora_merge_force_fp32`` in a config is accepted and said."""

from __future__ import annotations

import json
import os

import pytest
import torch
from safetensors import safe_open

from lorabind.runtime.cli import main
from patching_helpers import write_component_folder

WAN21 = "wan2.1_t2v_tiny_bf16.safetensors"
LORA = "lorabind-tiny/wan2.1_t2v_14b_lora_rank64_lightx2v_4step.safetensors"


def _tensors(path) -> dict:
    with safe_open(str(path), "pt") as handle:
        return {key: handle.get_tensor(key) for key in handle.keys()}


def test_the_mergers_flags_merge_as_ours_do(tiny_models_root, tmp_path, capsys):
    from lorabind.tiny_models.single_files import write_tiny_single_files

    write_tiny_single_files(tiny_models_root)
    base, lora = tiny_models_root / "diffusion_models" / "lorabind-tiny" / WAN21, tiny_models_root / "loras" / LORA
    config = tmp_path / "merge.json"
    config.write_text(json.dumps({"lora_merge_force_fp32": True}))
    assert main(["merge", "--source-model", str(base), "--lora-model", str(lora), "--output",
                 str(tmp_path / "guide.safetensors"), "--output-dtype", "float32", "--alpha", "0.5",
                 "--config", str(config)]) == 0
    assert "'lora_merge_force_fp32': lorabind always merges in fp32" in capsys.readouterr().out
    assert main(["merge", "--model", str(base), "--lora", f"{lora}:0.5", "--out", str(tmp_path / "ours.safetensors"),
                 "--dtype", "fp32"]) == 0
    guide, ours = _tensors(tmp_path / "guide.safetensors"), _tensors(tmp_path / "ours.safetensors")
    assert guide.keys() == ours.keys() and all(torch.equal(guide[k], ours[k]) for k in ours)
    assert {t.dtype for t in guide.values() if t.is_floating_point()} == {torch.float32}


def test_the_extractors_flags_extract_as_ours_do(tmp_path):
    torch.manual_seed(0)
    base = {"blocks.0.attn.to_q.weight": torch.randn(8, 8), "blocks.0.norm.weight": torch.randn(8)}
    write_component_folder(tmp_path, "base", base)
    write_component_folder(tmp_path, "tuned", {k: v + 0.1 * torch.randn_like(v) for k, v in base.items()})
    assert main(["extract", "--source-model", str(tmp_path / "base"), "--target-model", str(tmp_path / "tuned"),
                 "--output", str(tmp_path / "guide.safetensors"), "--output-dtype", "float16", "--rank", "4"]) == 0
    assert main(["extract", "--base", str(tmp_path / "base"), "--tuned", str(tmp_path / "tuned"), "--out",
                 str(tmp_path / "ours.safetensors"), "--dtype", "fp16", "--rank", "4"]) == 0
    guide, ours = _tensors(tmp_path / "guide.safetensors"), _tensors(tmp_path / "ours.safetensors")
    assert guide.keys() == ours.keys() and all(torch.equal(guide[k], ours[k]) for k in ours)
    assert guide["transformer.blocks.0.attn.to_q.lora_A.weight"].dtype == torch.float16


@pytest.mark.parametrize("argv, workers", [(["--num-weight-load-threads", "3"], "3"),
                                           (["--disable-multithread-weight-load"], "1")])
def test_serves_weight_load_flags_set_the_loading_threads(argv, workers, load_workers_restored, serve_args):
    from lorabind.runtime.device_options import apply_device_arguments
    from lorabind.runtime.guide_flags import apply_serve_guide_arguments

    args = serve_args(*argv, "--lora-scale", "1")
    assert apply_device_arguments(args) is None and apply_serve_guide_arguments(args) is None
    assert os.environ["LORABIND_LOAD_WORKERS"] == workers


def test_serves_other_lora_scales_are_refused_in_one_line_naming_ours(tmp_path, capsys):
    assert main(["serve", "--models", str(tmp_path), "--lora-backend", "distill", "--lora-path", "x.safetensors",
                 "--lora-scale", "0.5"]) == 2
    out = capsys.readouterr().out.strip()
    assert out == ("lorabind serve: --lora-scale 0.5: not supported; --lora-path distill files are fused at strength "
                   "1 (what their contract is trained for), and a request sets its adapter's scale with lora.scale")


def test_a_lora_scale_on_the_peft_backend_is_answered_for_the_peft_backend(tmp_path, capsys):
    """Issue 59 item 4: it was refused with the distill backend's message."""
    assert main(["serve", "--models", str(tmp_path), "--lora-scale", "0.5"]) == 2
    out = capsys.readouterr().out.strip()
    assert out == ("lorabind serve: --lora-scale 0.5: with --lora-backend peft the --lora-path files are adapters "
                   "loaded for requests to use, each at the scale its request's lora.scale gives")
    assert "distill" not in out
