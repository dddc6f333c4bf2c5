"""`lorabind models check WORKFLOW` and the real-size example workflows in workflows/real/ (issue 26). The real
workflows are not run (no real weights here); they are checked for structure and for what `models check` says."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import lorabind
from lorabind.loaders.placement.published import known_sources
from lorabind.runtime import folder_paths
from lorabind.runtime.cli import main

WORKFLOWS = Path(lorabind.__file__).parent / "workflows"
REAL = sorted((WORKFLOWS / "real").glob("*.api.json"))  # each with its UI form beside it (test_real_workflow_sources)


def _check(workflow: Path, models_root: Path) -> int:
    try:
        return main(["models", "check", str(workflow), "--models", str(models_root)])
    finally:
        folder_paths.configure()


def test_there_are_the_three_real_workflows_in_both_forms():
    assert [p.name for p in REAL] == ["qwen_image_lightning.api.json", "wan22_i2v_a14b_lightx2v.api.json",
                                      "wan22_t2v_a14b_lightx2v.api.json"]
    assert all(p.with_name(p.name.replace(".api.json", ".json")).is_file() for p in REAL)


@pytest.mark.parametrize("workflow", REAL, ids=lambda p: p.stem)
def test_real_workflow_is_a_well_formed_prompt_of_known_nodes(workflow):
    from lorabind.runtime.commands.run import load_node_classes

    node_classes, _ = load_node_classes()
    prompt = json.loads(workflow.read_text())
    for node_id, node in prompt.items():
        assert node["class_type"] in node_classes, node_id
        declared = node_classes[node["class_type"]].INPUT_TYPES()
        known = {**declared.get("required", {}), **declared.get("optional", {})}
        assert set(node["inputs"]) <= set(known), (node_id, set(node["inputs"]) - set(known))
        for value in node["inputs"].values():
            if isinstance(value, list):
                assert value[0] in prompt, (node_id, value)


def test_models_check_on_an_empty_models_folder_names_every_file_with_its_folder(tmp_path, capsys):
    assert _check(WORKFLOWS / "real" / "wan22_t2v_a14b_lightx2v.json", tmp_path) == 1
    out = capsys.readouterr().out
    expected = [
        ("denoiser", "diffusion_models/wan2.2_t2v_high_noise_14B_fp8_scaled.safetensors", "diffusion_models"),
        ("denoiser_low_noise", "diffusion_models/wan2.2_t2v_low_noise_14B_fp8_scaled.safetensors", "diffusion_models"),
        ("vae", "vae/wan_2.1_vae.safetensors", "vae"),
        ("text_encoder", "text_encoders/umt5_xxl_fp8_e4m3fn_scaled.safetensors", "text_encoders"),
        ("high_noise_lora", "loras/wan2.2_t2v_A14b_high_noise_lora_rank64_lightx2v_4step_1217.safetensors", "loras"),
        ("low_noise_lora", "loras/wan2.2_t2v_A14b_low_noise_lora_rank64_lightx2v_4step_1217.safetensors", "loras"),
    ]
    lines = [line for line in out.splitlines() if line.startswith("MISSING")]
    assert len(lines) == len(expected)
    for line, (input_name, name, folder) in zip(lines, expected):
        assert f" {input_name}: {name} — searched " in line and str(tmp_path / folder) in line
    assert "0 found, 6 missing" in out


@pytest.mark.parametrize("workflow", REAL + [p.with_name(p.name.replace(".api.json", ".json")) for p in REAL],
                         ids=lambda p: p.name)
def test_every_real_workflow_reports_each_missing_file(workflow, tmp_path, capsys):
    assert _check(workflow, tmp_path) == 1
    out = capsys.readouterr().out
    assert "found    " not in out and out.count("MISSING") >= 4


def test_models_check_says_what_a_found_file_is(tiny_models_root, capsys):
    from lorabind.tiny_models.single_files import ensure_tiny_single_files, tiny_file_names

    ensure_tiny_single_files([n for names in tiny_file_names().values() for n in names], tiny_models_root)
    assert _check(WORKFLOWS.parent / "workflows" / "wan22_single_files_fp8.json", tiny_models_root) == 0
    out = capsys.readouterr().out
    assert ("found    node 1 denoiser: diffusion_models/lorabind-tiny/wan2.2_t2v_high_noise_tiny_fp8_scaled.safetensors"
            " — Wan2.2 T2V tiny high-noise expert (fp8_scaled)") in out
    assert "4 found, 0 missing" in out


def test_run_of_a_missing_model_says_which_folders_were_searched_without_absolute_paths(tmp_path, capsys):
    try:
        code = main(["run", str(WORKFLOWS / "real" / "wan22_t2v_a14b_lightx2v.json"), "--models", str(tmp_path)])
    finally:
        folder_paths.configure()
    err = capsys.readouterr().err
    assert code == 1
    assert "input 'denoiser': Value not in list" in err and "searched models/unet, models/diffusion_models" in err
    validation = err[err.index("Prompt outputs failed validation"):]  # the same text reaches the browser
    assert "searched models/loras" in validation and str(tmp_path) not in validation
    # the command line also names the one command that gets the files (issue 55)
    assert (f"lorabind run: 6 model file(s) missing under {tmp_path} (" in err
            and "get them with: lorabind models download " in err
            and f"real/wan22_t2v_a14b_lightx2v.json --models {tmp_path} (or add --download)" in err)


def test_empty_truncated_and_wrong_kind_files_are_broken_not_found(tmp_path, capsys):
    """Issue 45 item 5: a 0-byte or cut-off download counted as found ("6 found, 0 missing", exit 0)."""
    import torch
    from safetensors.torch import save_file

    workflow = WORKFLOWS / "real" / "wan22_t2v_a14b_lightx2v.api.json"
    names = {node["inputs"][key]: key for node in json.loads(workflow.read_text()).values()
             for key in ("denoiser", "denoiser_low_noise", "vae", "text_encoder", "high_noise_lora", "low_noise_lora")
             if key in node["inputs"]}
    folders = {"denoiser": "diffusion_models", "denoiser_low_noise": "diffusion_models", "vae": "vae",
               "text_encoder": "text_encoders", "high_noise_lora": "loras", "low_noise_lora": "loras"}
    paths = {key: tmp_path / folders[key] / name for name, key in names.items()}
    for path in paths.values():
        path.parent.mkdir(parents=True, exist_ok=True)
    paths["denoiser"].write_bytes(b"")  # a download that never started
    save_file({"blocks.0.weight": torch.zeros(64, 64)}, str(paths["denoiser_low_noise"]))
    whole = paths["denoiser_low_noise"].read_bytes()
    paths["denoiser_low_noise"].write_bytes(whole[: len(whole) // 2])  # a download cut in the middle
    save_file({"not_a_vae.weight": torch.zeros(2, 2)}, str(paths["vae"]))  # another kind of file
    paths["text_encoder"].write_text("<html>404 Not Found</html>")  # a saved error page
    paths["high_noise_lora"].write_bytes(b"")
    save_file({"x.lora_A.weight": torch.zeros(4, 8)}, str(paths["low_noise_lora"]))
    paths["low_noise_lora"].write_bytes(paths["low_noise_lora"].read_bytes()[:-8])

    assert _check(workflow, tmp_path) == 1
    out = capsys.readouterr().out
    broken = [line for line in out.splitlines() if line.startswith("BROKEN")]
    assert len(broken) == 6, out
    assert any(" denoiser: diffusion_models/" in line and "0 bytes" in line for line in broken), broken
    assert any(" denoiser_low_noise: " in line and "truncated" in line for line in broken), broken
    assert "found    " not in out
    assert "0 found, 0 missing, 6 broken" in out


def test_every_missing_line_gives_a_source_and_a_file_in_another_folder_is_found_there(tmp_path, capsys):
    """Issue 54: a MISSING line said only where it looked; a file put in checkpoints/ instead of
    diffusion_models/ was reported missing without a word about where it was."""
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "wan2.2_t2v_high_noise_14B_fp8_scaled.safetensors").write_bytes(b"")
    assert _check(WORKFLOWS / "real" / "wan22_t2v_a14b_lightx2v.json", tmp_path) == 1
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("MISSING")]
    assert len(lines) == 6 and all("; source: " in line for line in lines)
    by_input = {line.split(": ", 1)[0].split()[-1]: line for line in lines}
    assert ("— found in checkpoints/, move it to diffusion_models/; searched "
            in by_input["denoiser"]) and "found in" not in by_input["denoiser_low_noise"]
    sources = known_sources()
    assert by_input["denoiser"].endswith(
        "source: " + sources["diffusion_models/wan2.2_t2v_high_noise_14B_fp8_scaled.safetensors"])
    assert by_input["high_noise_lora"].split("source: ")[1].startswith("https://")


def test_a_source_is_the_files_address_in_the_published_table():
    from lorabind.usecases import file_sources

    assert file_sources.source_of("diffusion_models", "Wan2.2-T2V-A14B-HighNoise-Q4_K_M.gguf") == \
        known_sources()["diffusion_models/Wan2.2-T2V-A14B-HighNoise-Q4_K_M.gguf"]
    assert file_sources.source_of("vae", "mine.safetensors").startswith("not a published file lorabind lists")
