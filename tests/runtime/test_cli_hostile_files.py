"""The command line on hostile files (issue #13): deeply nested JSON, workflows that are no workflow, non-finite
LoRA tensors, a symlink loop in the models folder. Each a clear message naming the file, never a traceback."""

from __future__ import annotations

import json
import os
import struct
import threading

import pytest
import torch
from safetensors.torch import save_file

from lorabind.loaders.lora import clear_lora_cache
from lorabind.runtime import folder_paths
from lorabind.runtime.cli import main

DEEP = "[" * 100_000


@pytest.fixture(autouse=True)
def _clean():
    clear_lora_cache()
    yield
    clear_lora_cache()
    folder_paths.configure()


@pytest.fixture(scope="module")
def tiny_wan22(tmp_path_factory):
    from lorabind.tiny_models.wan import build_tiny_wan22

    return str(build_tiny_wan22(tmp_path_factory.mktemp("models")))


def _run(argv, capsys):
    code = main(argv)
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err and "RecursionError" not in captured.err
    return code, captured.out, captured.err


@pytest.mark.parametrize("content, message", [
    (DEEP, "is not valid JSON: JSON nested more than 100 levels deep"),
    ("[]", "Not a ComfyUI workflow"),
    ("{}", "Not a ComfyUI workflow"),
])
def test_run_names_the_workflow_file_it_refuses(tmp_path, capsys, content, message):
    workflow = tmp_path / "odd.json"
    workflow.write_text(content)
    code, _, err = _run(["run", str(workflow), "--models", str(tmp_path / "m"), "--output", str(tmp_path / "o")],
                        capsys)
    assert code == 1 and str(workflow) in err and message in err


def test_inspect_refuses_deep_headers_and_configs(tmp_path, capsys):
    header = DEEP.encode()
    deep_file = tmp_path / "deep.safetensors"
    deep_file.write_bytes(struct.pack("<Q", len(header)) + header)
    code, _, err = _run(["inspect", str(deep_file)], capsys)
    # refused by the header budget before it is parsed (issue 31), naming the file
    assert code == 1 and "deep.safetensors: safetensors header nests deeper than the format's 3 levels" in err
    folder = tmp_path / "peft"
    folder.mkdir()
    save_file({"a.lora_A.weight": torch.ones(2, 4), "a.lora_B.weight": torch.ones(4, 2)},
              str(folder / "adapter_model.safetensors"))
    (folder / "adapter_config.json").write_text(DEEP)
    code, _, err = _run(["inspect", str(folder)], capsys)
    assert code == 1 and "peft: cannot read adapter_config.json (JSON nested" in err


def test_inspect_reports_non_finite_tensors(tmp_path, capsys):
    down = torch.ones(2, 24)
    down[1, 5] = float("nan")
    path = tmp_path / "nan.safetensors"
    save_file({"diffusion_model.blocks.0.self_attn.q.lora_down.weight": down,
               "diffusion_model.blocks.0.self_attn.q.lora_up.weight": torch.ones(24, 2)}, str(path))
    code, out, err = _run(["inspect", str(path)], capsys)
    assert code == 1 and "tensor 'diffusion_model.blocks.0.self_attn.q.lora_down.weight' holds NaN" in err


@pytest.mark.parametrize("up_value,warned", [(1e38, True), (1e37, False)])
def test_inspect_warns_when_a_pairs_product_overflows(tmp_path, capsys, up_value, warned):
    path = tmp_path / "huge.safetensors"  # finite factors; rank 4: up @ down = 4 x up_value
    save_file({"diffusion_model.blocks.0.self_attn.q.lora_down.weight": torch.ones(4, 24),
               "diffusion_model.blocks.0.self_attn.q.lora_up.weight": torch.full((24, 4), up_value),
               "diffusion_model.blocks.0.self_attn.k.lora_down.weight": torch.ones(4, 24),
               "diffusion_model.blocks.0.self_attn.k.lora_up.weight": torch.ones(24, 4)}, str(path))
    code, out, _ = _run(["inspect", str(path)], capsys)
    assert code == 0
    assert ("warning:" in out and "overflows float32 at strength 1" in out) == warned
    code, out, _ = _run(["inspect", str(path), "--json"], capsys)
    warnings = json.loads(out)["warnings"]
    assert len(warnings) == (1 if warned else 0)
    assert all(w.startswith("blocks.0.self_attn.q: ") for w in warnings)  # the k pair is fine


def test_merge_refuses_non_finite_results_and_writes_nothing(tiny_wan22, tmp_path, capsys):
    nan = tmp_path / "nan.safetensors"
    save_file({"diffusion_model.blocks.0.self_attn.q.lora_down.weight": torch.full((2, 24), float("inf")),
               "diffusion_model.blocks.0.self_attn.q.lora_up.weight": torch.ones(24, 2)}, str(nan))
    code, _, err = _run(["merge", "--model", tiny_wan22, "--lora", str(nan), "--out", str(tmp_path / "a")], capsys)
    assert code == 1 and "holds NaN or infinite values" in err and not (tmp_path / "a").exists()
    big = tmp_path / "big.safetensors"  # finite factors whose product overflows bf16 (max 3.4e38)
    save_file({"diffusion_model.blocks.0.self_attn.q.lora_down.weight": torch.full((2, 24), 1e19),
               "diffusion_model.blocks.0.self_attn.q.lora_up.weight": torch.full((24, 2), 1e19)}, str(big))
    code, _, err = _run(["merge", "--model", tiny_wan22, "--lora", f"{big}:4", "--dtype", "bf16",
                         "--out", str(tmp_path / "b")], capsys)
    assert code == 1 and "transformer:blocks.0.attn1.to_q.weight: the fused value is not finite in bfloat16" in err
    assert not (tmp_path / "b").exists() and [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_merge_refuses_a_deep_shard_index(tiny_wan22, tmp_path, capsys):
    lora = tmp_path / "ok.safetensors"
    save_file({"diffusion_model.blocks.0.self_attn.q.lora_down.weight": torch.ones(2, 24),
               "diffusion_model.blocks.0.self_attn.q.lora_up.weight": torch.ones(24, 2)}, str(lora))
    model = tmp_path / "model"
    import shutil

    shutil.copytree(tiny_wan22, model)
    (model / "transformer" / "diffusion_pytorch_model.safetensors.index.json").write_text(DEEP)
    code, _, err = _run(["merge", "--model", str(model), "--lora", str(lora), "--out", str(tmp_path / "c")], capsys)
    assert code == 1 and "JSON nested more than" in err and not (tmp_path / "c").exists()


def test_a_symlink_loop_in_the_loras_folder_lists_in_finite_time(tmp_path):
    loras = tmp_path / "models" / "loras"
    (loras / "sub").mkdir(parents=True)
    (loras / "sub" / "a.safetensors").write_bytes(b"x")
    (loras / "b.sft").write_bytes(b"x")
    os.symlink(".", loras / "loop")
    os.symlink("..", loras / "sub" / "up")
    folder_paths.configure(models_root=str(tmp_path / "models"))
    result = []
    worker = threading.Thread(target=lambda: result.append(folder_paths.get_filename_list("loras")), daemon=True)
    worker.start()
    worker.join(20)
    assert result == [["b.sft", "sub/a.safetensors"]]
