"""Issue 59 item 4: vllm-omni's serving flags that lorabind does not reproduce are each answered in one line saying
what lorabind does instead (exit 2), never argparse's bare "unrecognized arguments"; the three whose meaning is
lorabind's default are taken and said; and ``--lora-backend distill`` without ``--lora-path`` does not start."""

from __future__ import annotations

import pytest

from lorabind.runtime.cli import main
from lorabind.runtime.guide_flags import VLLM_OMNI_NOTED, VLLM_OMNI_REFUSED, serve_guide_notes

# how the guides type them: a bare switch, or a flag with its value
TYPED = {"--quantization": ["fp8"], "--hsdp-shard-size": ["2"], "--hsdp-replicate-size": ["1"],
         "--cache-backend": ["cache_dit"], "--cache-config": ['{"rel_l1_thresh": 0.2}'], "--num-gpus": ["2"],
         "--usp": ["2"], "--ulysses-mode": ["advanced_uaa"], "--boundary-ratio": ["0.875"], "--flow-shift": ["5.0"],
         "--vae-patch-parallel-size": ["2"], "--default-sampling-params": ['{"0": {"num_inference_steps": 4}}'],
         "--diffusion-attention-backend": ["FLASH_ATTN"], "--max-generated-image-size": ["1048576"],
         "--task-type": ["i2v"], "--gpu-memory-utilization": ["0.9"], "--served-model-name": ["wan"],
         "--model": ["Wan-AI/Wan2.2-T2V-A14B-Diffusers"], "--host": ["0.0.0.0"], "--text-encoder-tp-size": ["2"],
         "--diffusion-offload-config": ['{"mode": "module"}'],
         "--diffusion-quantization-config": ['{"method": "fp8"}']}
# the flags issue 59 names, and what each line must point to
NAMED = {"--enable-cpu-offload": "--memory offload_model", "--quantization": "fp8 (scaled) or GGUF",
         "--use-hsdp": "--parallel tp=N"}


@pytest.mark.parametrize("flag", sorted(VLLM_OMNI_REFUSED))
def test_each_vllm_omni_flag_is_answered_in_one_line(flag, tmp_path, capsys):
    code = main(["serve", "--models", str(tmp_path), flag, *TYPED.get(flag, [])])
    captured = capsys.readouterr()
    lines = captured.out.strip().splitlines()
    assert code == 2 and "unrecognized arguments" not in captured.err
    assert lines == [f"lorabind serve: {flag}: vllm-omni's flag; {VLLM_OMNI_REFUSED[flag]}"]
    if flag in NAMED:
        assert NAMED[flag] in lines[0]


def test_the_issues_flags_are_among_them():
    assert {"--enable-cpu-offload", "--quantization", "--use-hsdp"} <= set(VLLM_OMNI_REFUSED)
    assert len(VLLM_OMNI_REFUSED) >= 12


def test_the_flags_lorabind_already_means_are_taken_and_said(serve_args):
    args = serve_args(*VLLM_OMNI_NOTED)
    assert serve_guide_notes(args) == [f"{flag}: {note}" for flag, note in VLLM_OMNI_NOTED.items()]
    assert serve_guide_notes(serve_args()) == []


def test_the_distill_backend_without_files_does_not_start(tmp_path, capsys):
    assert main(["serve", "--models", str(tmp_path), "--lora-backend", "distill"]) == 2
    assert capsys.readouterr().out.strip() == (
        "lorabind serve: --lora-backend distill needs --lora-path FILE... (the distill LoRA files to fuse at start); "
        "without them it would fuse nothing")
