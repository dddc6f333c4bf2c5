"""Issue 28: `lorabind merge` on single files. The lightx2v pair merged into the tiny Wan2.2 expert files writes
two single files that `LoraBindCheckpointLoader` runs like the in-memory fuse of the same pair (bit for bit in
bf16; within FP8_RENDER_TOLERANCE for fp8 scaled), with the pair's contract baked in and enforced."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open

from lorabind.loaders.errors import ContractError
from lorabind.loaders.families import family_by_id
from lorabind.loaders.models.store import clear_cache
from lorabind.runtime.cli import main
from lorabind.tiny_models.lora_fixtures import WAN22_HIGH, WAN22_LOW
from single_file_helpers import call

TINY = "lorabind-tiny/"
EXPERTS = ("wan2.2_t2v_high_noise_tiny_{}.safetensors", "wan2.2_t2v_low_noise_tiny_{}.safetensors")
CONTRACT_SAMPLER = {"seed": 7, "steps": 4, "cfg": 1.0, "shift": 5.0, "boundary": 0.0, "enforce_contract": True,
                    "cfg_low_noise": 0.0}
# fp8 tolerance, stated on the mean absolute pixel difference (0..1) of a 4-step tiny render. The merged fp8
# files give each fused weight its own scale (amax / 448); the in-memory fuse rounds into the source's scale and
# so clips every fused value past +-448 x that scale (the tiny fixture LoRAs double some tensors' range). Measured:
# merged fp8 vs the exact (float32 sum in bf16) render 0.011, in-memory fp8 vs exact 0.040, merged vs in-memory
# under 0.05 (max pixel differences 0.21 / 0.49: a random tiny model amplifies one fp8 step)
FP8_MEAN_TOLERANCE = 0.02
FP8_IN_MEMORY_TOLERANCE = 0.06

@pytest.fixture
def root(single_file_root, registry_at):
    registry_at(single_file_root)
    yield single_file_root
    clear_cache()


def _merge(root, precision: str, out_names: tuple, *extra) -> int:
    models = root / "diffusion_models" / TINY
    loras = root / "loras"
    args = ["merge"]
    for name in EXPERTS:
        args += ["--model", str(models / name.format(precision))]
    for out in out_names:
        args += ["--out", str(root / "diffusion_models" / out)]
    return main([*args, "--lora", f"transformer={loras / WAN22_HIGH}", "--lora", f"transformer_2={loras / WAN22_LOW}",
                 "--overwrite", *extra])


def _load(high: str, low: str):
    model, _ = call("LoraBindCheckpointLoader", denoiser=high, denoiser_low_noise=low,
                    vae=f"{TINY}wan_2.1_vae_tiny.safetensors", text_encoder=f"{TINY}umt5_tiny_bf16.safetensors",
                    dtype="bfloat16")
    return model


def _render(model, **sampler) -> torch.Tensor:
    (positive,) = call("LoraBindTextEncode", model=model, text="a cat dancing on the street")
    (negative,) = call("LoraBindTextEncode", model=model, text="")
    (latent,) = call("LoraBindEmptyLatent", model=model, width=32, height=32, frames=5, batch_size=1)
    sampled = call("LoraBindSampler", model=model, positive=positive, negative=negative, latent=latent,
                   **{**CONTRACT_SAMPLER, **sampler})
    (images,) = call("LoraBindVAEDecode", model=model, latent=sampled["result"][0])
    return images


def _fused_in_memory(precision: str) -> torch.Tensor:
    model = _load(*(TINY + name.format(precision) for name in EXPERTS))
    paired = call("WanMoELoRAPair", model=model, high_noise_lora=WAN22_HIGH, high_noise_strength=1.0,
                  low_noise_lora=WAN22_LOW, low_noise_strength=1.0)["result"][0]
    return _render(paired)


@pytest.mark.slow
def test_bf16_merge_of_the_pair_renders_bit_for_bit_like_the_in_memory_fuse(root):
    outs = ("merged/wan2.2_t2v_high_noise_merged_bf16.safetensors", "merged/wan2.2_t2v_low_noise_merged_bf16.safetensors")
    assert _merge(root, "bf16", outs) == 0
    merged = _render(_load(*outs))
    assert torch.equal(merged, _fused_in_memory("bf16"))


@pytest.mark.slow
def test_fp8_merge_writes_two_fp8_scaled_files_within_tolerance_and_enforces_the_contract(root):
    outs = ("merged/wan2.2_t2v_high_noise_merged_fp8_scaled.safetensors",
            "merged/wan2.2_t2v_low_noise_merged_fp8_scaled.safetensors")
    assert _merge(root, "fp8_scaled", outs, "--dtype", "fp8_e4m3fn") == 0
    for out in outs:
        with safe_open(str(root / "diffusion_models" / out), framework="pt") as handle:
            keys, metadata = set(handle.keys()), handle.metadata()
            fp8_weights = [k for k in keys if handle.get_slice(k).get_dtype() == "F8_E4M3" and k != "scaled_fp8"]
        assert "scaled_fp8" in keys and len(fp8_weights) > 10
        assert all(k[: -len(".weight")] + ".scale_weight" in keys for k in fp8_weights)
        baked = json.loads(metadata["_lorabind"])
        assert [c["steps"] for c in baked["contracts"]] == [4] and metadata["lorabind_output"] == "lorabind merge"
    model = _load(*outs)
    merged = _render(model).float()
    exact_outs = ("merged/wan2.2_t2v_high_noise_exact_bf16.safetensors",
                  "merged/wan2.2_t2v_low_noise_exact_bf16.safetensors")
    assert _merge(root, "fp8_scaled", exact_outs) == 0
    exact = _render(_load(*exact_outs)).float()
    in_memory = _fused_in_memory("fp8_scaled").float()
    to_exact, in_memory_to_exact = (merged - exact).abs().mean().item(), (in_memory - exact).abs().mean().item()
    assert to_exact <= FP8_MEAN_TOLERANCE and to_exact < in_memory_to_exact, (to_exact, in_memory_to_exact)
    assert (merged - in_memory).abs().mean().item() <= FP8_IN_MEMORY_TOLERANCE
    with pytest.raises(ContractError, match=r"steps must be 4, got 20"):
        _render(model, steps=20)


def test_fp8_merged_weights_are_within_half_an_fp8_step_of_the_float32_sum(root):
    outs = ("merged/wan2.2_t2v_high_noise_step_fp8.safetensors", "merged/wan2.2_t2v_low_noise_step_fp8.safetensors")
    exact_outs = ("merged/wan2.2_t2v_high_noise_step_fp32.safetensors",
                  "merged/wan2.2_t2v_low_noise_step_fp32.safetensors")
    assert _merge(root, "fp8_scaled", outs, "--dtype", "fp8_e4m3fn") == 0
    assert _merge(root, "fp8_scaled", exact_outs, "--dtype", "fp32") == 0
    checked = 0
    with safe_open(str(root / "diffusion_models" / outs[0]), "pt") as merged, \
            safe_open(str(root / "diffusion_models" / exact_outs[0]), "pt") as exact:
        for key in merged.keys():
            if key == "scaled_fp8" or merged.get_slice(key).get_dtype() != "F8_E4M3":
                continue
            scale = merged.get_tensor(key[: -len(".weight")] + ".scale_weight").float()
            value, reference = merged.get_tensor(key).float() * scale, exact.get_tensor(key).float()
            assert reference.abs().max() <= 448 * scale * (1 + 1e-6), key  # nothing clipped
            # half a step of e4m3 (3 mantissa bits): 2^-4 relative, 2^-10 x scale among subnormals
            assert ((value - reference).abs() <= reference.abs() * 2 ** -4 + scale * 2 ** -10).all(), key
            checked += 1
    assert checked > 10


def test_a_bf16_merge_from_fp8_files_is_the_float32_sum_rounded_once(root):
    """Each merged weight = bf16(float32(fp8 x scale) + strength x scale x up @ down): one rounding."""
    from lorabind.loaders.families.wan.key_layouts import WAN_TRANSFORMER
    from lorabind.loaders.lora.mapping import map_to_model
    from lorabind.loaders.lora.reader import read_lora

    outs = ("merged/wan2.2_t2v_high_noise_from_fp8_bf16.safetensors",
            "merged/wan2.2_t2v_low_noise_from_fp8_bf16.safetensors")
    assert _merge(root, "fp8_scaled", outs) == 0  # default --dtype: bf16
    native = "blocks.0.self_attn.q.weight"
    with safe_open(str(root / "diffusion_models" / TINY / EXPERTS[0].format("fp8_scaled")), "pt") as handle:
        value = handle.get_tensor(native).float() * handle.get_tensor("blocks.0.self_attn.q.scale_weight").float()
    with safe_open(str(root / "diffusion_models" / outs[0]), "pt") as handle:
        merged = handle.get_tensor(native)
        assert "scaled_fp8" not in handle.keys()
    mapped = map_to_model(read_lora(str(root / "loras" / WAN22_HIGH)), "wan2.2_moe", family_by_id("wan2.2_moe"))
    delta = mapped.targets[
        WAN_TRANSFORMER.to_diffusers(native).rsplit(".", 1)[0]].low_rank
    expected = (value + float(delta.scale) * (delta.up.float() @ delta.down.float())).to(torch.bfloat16)
    assert merged.dtype == torch.bfloat16 and torch.equal(merged, expected)


def test_swapped_expert_files_and_unpaired_outputs_are_refused_before_writing(root, capsys):
    models = root / "diffusion_models" / TINY
    out = models / "never.safetensors"
    high, low = (str(models / name.format("bf16")) for name in EXPERTS)
    lora = f"{root / 'loras' / WAN22_HIGH}"
    assert main(["merge", "--model", low, "--model", high, "--lora", lora, "--out", str(out),
                 "--out", str(models / "never2.safetensors")]) == 1
    assert "swapped" in capsys.readouterr().err
    assert main(["merge", "--model", high, "--model", low, "--lora", lora, "--out", str(out)]) == 1
    assert "one --out per --model file: 2 model file(s), 1 --out" in capsys.readouterr().err
    assert not out.exists()


def test_a_lightx2v_yaml_config_merges_and_its_unsupported_keys_are_refused_by_name(root, tmp_path, capsys):
    models = root / "diffusion_models" / TINY
    high, low = (str(models / name.format("bf16")) for name in EXPERTS)
    outs = [str(root / "diffusion_models" / "merged" / f"wan2.2_t2v_{e}_noise_yaml_bf16.safetensors")
            for e in ("high", "low")]
    config = tmp_path / "convert.yaml"
    config.write_text(f"source: [{high}, {low}]\noutput: [{outs[0]}, {outs[1]}]\nlora_key_convert: auto\n"
                      "lora_configs:\n"
                      f"  - {{name: low_noise_model, path: {root / 'loras' / WAN22_LOW}, strength: 1.0}}\n"
                      f"  - {{name: high_noise_model, path: {root / 'loras' / WAN22_HIGH}, strength: 1.0}}\n")
    assert main(["merge", "--config", str(config), "--overwrite"]) == 0
    for out, lora in zip(outs, (WAN22_HIGH, WAN22_LOW)):  # each LoRA went into the expert its name says
        with safe_open(out, framework="pt") as handle:
            assert json.loads(handle.metadata()["_lorabind"])["fused"][0]["name"].endswith(lora.rsplit("/", 1)[-1])
    config.write_text(config.read_text() + "lora_alpha: [8]\n")
    assert main(["merge", "--config", str(config), "--overwrite"]) == 1
    assert "LightX2V's 'lora_alpha' is not supported" in capsys.readouterr().err
