"""The synthetic LoRA fixtures: published names, real key layouts, tiny shapes, deterministic bytes."""

import json

import pytest
from safetensors import safe_open

from lorabind.tiny_models import lora_fixtures
from lorabind.tiny_models.lora_fixtures import write_fixture_loras

PUBLISHED_NAMES = {
    "wan2.2_t2v_A14b_high_noise_lora_rank64_lightx2v_4step_1217.safetensors",
    "wan2.2_t2v_A14b_low_noise_lora_rank64_lightx2v_4step_1217.safetensors",
    "wan2.1_t2v_14b_lora_rank64_lightx2v_4step.safetensors",
    "Qwen-Image-Lightning-4steps-V1.0.safetensors",
}


def _keys(path):
    with safe_open(str(path), framework="pt") as handle:
        return set(handle.keys())


def test_fixtures_carry_the_published_names_and_stay_tiny(tiny_models_root):
    loras = tiny_models_root / "loras" / "lorabind-tiny"
    files = {p.name for p in loras.iterdir() if p.is_file()}
    assert PUBLISHED_NAMES <= files
    assert all((loras / name).stat().st_size < 200_000 for name in PUBLISHED_NAMES)


def test_wan_fixture_uses_the_lightx2v_native_layout(tiny_models_root):
    keys = _keys(tiny_models_root / "loras" / lora_fixtures.WAN22_HIGH)
    assert all(key.startswith("diffusion_model.") for key in keys)
    suffixes = {key.rsplit(".", 1)[-1] for key in keys} | {".".join(key.rsplit(".", 2)[-2:]) for key in keys}
    assert {"alpha", "diff_b", "diff", "diff_m", "lora_down.weight", "lora_up.weight"} <= suffixes
    assert "diffusion_model.blocks.0.self_attn.q.lora_down.weight" in keys
    assert "diffusion_model.blocks.1.diff_m" in keys
    assert "diffusion_model.head.head.lora_up.weight" in keys and "diffusion_model.head.head.alpha" not in keys
    with safe_open(str(tiny_models_root / "loras" / lora_fixtures.WAN22_HIGH), framework="pt") as handle:
        alpha = handle.get_tensor("diffusion_model.blocks.0.self_attn.q.alpha").item()
        rank = handle.get_tensor("diffusion_model.blocks.0.self_attn.q.lora_down.weight").shape[0]
        modulation = handle.get_tensor("diffusion_model.blocks.0.diff_m")
    assert alpha / rank == pytest.approx(8 / 64)  # the published alpha/rank ratio
    config = json.loads((tiny_models_root / "diffusers/tiny-wan22-t2v/transformer/config.json").read_text())
    assert tuple(modulation.shape) == (1, 6, config["num_attention_heads"] * config["attention_head_dim"])


def test_high_and_low_fixtures_differ(tiny_models_root):
    loras = tiny_models_root / "loras"
    assert (loras / lora_fixtures.WAN22_HIGH).read_bytes() != (loras / lora_fixtures.WAN22_LOW).read_bytes()


def test_qwen_fixture_uses_bare_diffusers_names_with_alpha(tiny_models_root):
    keys = _keys(tiny_models_root / "loras" / lora_fixtures.QWEN_LIGHTNING)
    assert "transformer_blocks.0.attn.to_q.lora_down.weight" in keys
    assert "transformer_blocks.1.img_mlp.net.2.alpha" in keys
    assert not any(key.startswith(("diffusion_model.", "transformer.")) for key in keys)


def test_peft_folder_has_lora_alpha_different_from_r(tiny_models_root):
    folder = tiny_models_root / "loras" / lora_fixtures.PEFT_FOLDER
    config = json.loads((folder / "adapter_config.json").read_text())
    assert config["lora_alpha"] != config["r"]
    keys = _keys(folder / "adapter_model.safetensors")
    assert all(key.startswith("base_model.model.blocks.") for key in keys)
    assert not any(".diff" in key for key in keys)


def test_rewriting_is_deterministic_and_leaves_unchanged_files_alone(tiny_models_root):
    paths = write_fixture_loras(tiny_models_root)
    stamps = {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in paths}
    again = write_fixture_loras(tiny_models_root)
    assert again == paths
    assert {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in again} == stamps


def test_models_that_are_not_built_get_no_fixture(tmp_path):
    assert write_fixture_loras(tmp_path) == []
    assert list((tmp_path / "loras").iterdir()) == []


def test_ensure_writes_the_fixtures_a_prompt_names_once_its_model_exists(tmp_path, tiny_models_root):
    import shutil

    from lorabind.tiny_models import ensure_fixture_loras

    shutil.copytree(tiny_models_root / "diffusers" / "tiny-wan21-t2v", tmp_path / "diffusers" / "tiny-wan21-t2v")
    named = {"tiny-wan21-t2v", lora_fixtures.WAN21_DISTILL, "a cat"}
    assert ensure_fixture_loras(named, tmp_path) == [lora_fixtures.WAN21_DISTILL]
    assert (tmp_path / "loras" / lora_fixtures.WAN21_DISTILL).read_bytes() == (
        tiny_models_root / "loras" / lora_fixtures.WAN21_DISTILL).read_bytes()
    assert ensure_fixture_loras(named, tmp_path) == []
    assert ensure_fixture_loras({lora_fixtures.QWEN_LIGHTNING}, tmp_path) == []  # its model is not built


def test_ensure_writes_minimax_fixtures_a_prompt_names(tmp_path):
    from lorabind.loaders.lora import read_lora
    from lorabind.tiny_models import ensure_fixture_loras, minimax_h3

    named = {f"lorabind-tiny/{minimax_h3.NATIVE_FIXTURE_NAME}"}
    assert ensure_fixture_loras(named, tmp_path) == [f"lorabind-tiny/{minimax_h3.NATIVE_FIXTURE_NAME}"]
    assert read_lora(tmp_path / "loras" / "lorabind-tiny" / minimax_h3.NATIVE_FIXTURE_NAME).metadata["key_format"] == "minimax-h3-native"
    assert ensure_fixture_loras(named, tmp_path) == []


def test_a_published_name_outside_the_fixture_folder_is_never_written(tmp_path, tiny_models_root):
    """A prompt naming the real lightx2v or MiniMax-H3 file (a user's missing download) gets no random stand-in."""
    import shutil

    from lorabind.tiny_models import ensure_fixture_loras, minimax_h3

    shutil.copytree(tiny_models_root / "diffusers" / "tiny-wan22-t2v", tmp_path / "diffusers" / "tiny-wan22-t2v")
    published = {name.split("/", 1)[1] for name in (*lora_fixtures.FIXTURE_NAMES, *minimax_h3.FIXTURE_NAMES)}
    assert ensure_fixture_loras(published | {"tiny-wan22-t2v"}, tmp_path) == []
    assert not (tmp_path / "loras").exists()
