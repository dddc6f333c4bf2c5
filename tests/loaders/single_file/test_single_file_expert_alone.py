"""One Wan2.2 A14B expert run alone (``denoiser_low_noise`` none) samples every step on that expert: the sampler
warns in its report and its ui text (what ComfyUI shows, what ``lorabind run`` prints, what the WebSocket's
``executed`` message carries). Wan2.1 and TI2V-5B single files, and the expert pair, run without a warning."""

import pytest

from single_file_helpers import SAMPLER, call

TINY = "lorabind-tiny/"
CASES = {  # denoiser stems, VAE, frames, size
    "wan2.2 high-noise expert alone": (["wan2.2_t2v_high_noise_tiny"], "wan_2.1_vae_tiny", 5, 32),
    "wan2.2 low-noise expert alone": (["wan2.2_t2v_low_noise_tiny"], "wan_2.1_vae_tiny", 5, 32),
    "wan2.2 expert pair": (["wan2.2_t2v_high_noise_tiny", "wan2.2_t2v_low_noise_tiny"], "wan_2.1_vae_tiny", 5, 32),
    "wan2.1": (["wan2.1_t2v_tiny"], "wan_2.1_vae_tiny", 5, 32),
    "wan2.2 ti2v": (["wan2.2_ti2v_tiny"], "wan2.2_vae_tiny", 5, 64),
}


@pytest.fixture
def models_root(single_file_root, registry_at):
    registry_at(single_file_root)
    return single_file_root


def _sample(case: str) -> dict:
    """Load the case's single files and run the sampler node once; its ``{"ui": ..., "result": ...}``."""
    stems, vae, frames, size = CASES[case]
    names = [f"{TINY}{stem}_bf16.safetensors" for stem in stems]
    model, _ = call("LoraBindCheckpointLoader", denoiser=names[0],
                    denoiser_low_noise=names[1] if len(names) > 1 else "none", vae=f"{TINY}{vae}.safetensors",
                    text_encoder=f"{TINY}umt5_tiny_bf16.safetensors", dtype="bfloat16")
    (positive,) = call("LoraBindTextEncode", model=model, text="a cat dancing on the street")
    (latent,) = call("LoraBindEmptyLatent", model=model, width=size, height=size, frames=frames, batch_size=1)
    return call("LoraBindSampler", model=model, positive=positive, negative=positive, latent=latent, **SAMPLER)


@pytest.mark.parametrize("case", ["wan2.2 high-noise expert alone", "wan2.2 low-noise expert alone"])
def test_a_wan22_expert_run_alone_warns_in_the_report_and_the_ui_text(models_root, case):
    ui = _sample(case)["ui"]
    (report,) = ui["lorabind_schedule"]
    (warning,) = report["warnings"]
    file_name = f"{CASES[case][0][0]}_bf16.safetensors"
    assert warning.startswith(f"{file_name} is one of Wan2.2 A14B's two experts, run alone")
    assert "boundary 0.875" in warning
    assert "denoiser_low_noise" in warning  # says how to fix it
    assert f"warning: {warning}" in ui["text"]
    assert report["boundary"] is None  # it still runs as one model: every step on the expert it has
    assert set(report["experts"]) == {"transformer"}


@pytest.mark.parametrize("case", ["wan2.1", "wan2.2 ti2v", "wan2.2 expert pair"])
def test_wan21_ti2v_and_the_expert_pair_run_without_a_warning(models_root, case):
    ui = _sample(case)["ui"]
    (report,) = ui["lorabind_schedule"]
    assert report["warnings"] == []
    assert not [line for line in ui["text"] if "run alone" in line]


def test_an_a14b_folder_with_one_expert_warns_and_the_wan21_and_ti2v_folders_do_not(tiny_models_root, tmp_path):
    """The folder case: the tiny Wan2.2 folder with ``transformer_2`` unset keeps its ``boundary_ratio``."""
    import json
    import shutil

    from lorabind.loaders.families import family_for
    from lorabind.loaders.models.store import load_model

    one_expert = tmp_path / "tiny-wan22-t2v-one-expert"
    shutil.copytree(tiny_models_root / "diffusers" / "tiny-wan22-t2v", one_expert,
                    ignore=shutil.ignore_patterns("transformer_2"))
    index = json.loads((one_expert / "model_index.json").read_text())
    index["transformer_2"] = [None, None]
    (one_expert / "model_index.json").write_text(json.dumps(index))
    model = load_model(str(one_expert), name="tiny-wan22-t2v-one-expert")
    (warning,) = family_for(model).sampling.run_warnings(model)
    assert warning.startswith("tiny-wan22-t2v-one-expert is one of Wan2.2 A14B's two experts, run alone")
    for name in ("tiny-wan21-t2v", "tiny-wan22-ti2v", "tiny-wan22-t2v"):
        folder = load_model(str(tiny_models_root / "diffusers" / name), name=name)
        assert family_for(folder).sampling.run_warnings(folder) == [], name


@pytest.mark.slow
def test_lorabind_run_prints_the_warning_for_the_example_with_its_low_noise_expert_unset(
        single_file_root, tmp_path, capsys):
    from pathlib import Path

    import lorabind
    from lorabind.runtime import folder_paths
    from lorabind.runtime.cli import main

    workflow = Path(lorabind.__file__).parent / "workflows" / "api" / "wan22_single_files_fp8.api.json"
    try:
        code = main(["run", str(workflow), "--models", str(single_file_root), "--output", str(tmp_path),
                     "--set", "1.denoiser_low_noise=none"])
    finally:
        folder_paths.configure()
    out = capsys.readouterr().out
    assert code == 0
    assert ("node 5 (LoraBindSampler) text: warning: wan2.2_t2v_high_noise_tiny_fp8_scaled.safetensors is one of "
            "Wan2.2 A14B's two experts, run alone") in out
