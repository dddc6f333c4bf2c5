"""``usecases/host_models.py`` and ``host_sampling.py`` without ComfyUI: the contract check a ComfyUI sampler run gets (whole table, an
expert's part, any contiguous part, cfg, enforce_contract off), the pair's switch step, and the refusal of a DoRA
LoRA stacked after another LoRA on ComfyUI's MODEL."""

from types import SimpleNamespace

import pytest

from lorabind.loaders.contract_types import ScheduleContract
from lorabind.loaders.contracts.sigmas import shifted_sigmas
from lorabind.loaders.errors import ContractError, LoraBindError
from lorabind.usecases import host_models as hm
from lorabind.usecases import host_sampling as hs

LIGHTX2V = ScheduleContract(source="wan2.2_t2v_A14b_high_noise_lora_rank64_lightx2v_4step_1217.safetensors",
                            kind="distill", family="wan2.2_moe", steps=4, shift=5.0, cfg=1.0)
TABLE = shifted_sigmas(4, 5.0)  # [1, 0.9375, 0.8333, 0.625, 0]


def _run(sigmas, cfg: float) -> hs.HostRun:
    """A KSampler-style run: plain cfg, no step rule named."""
    return hs.HostRun(tuple(sigmas), hs.plain_cfg(cfg))


def test_the_table_is_the_shifted_published_points_and_the_pair_switches_below_the_boundary():
    assert hm.sigma_table(LIGHTX2V) == pytest.approx((1.0, 0.9375, 0.833333, 0.625, 0.0), abs=1e-6)
    assert hm.switch_step(TABLE, 0.875) == 2
    assert hm.switch_step(TABLE, 0.0) == 4  # no step below the boundary: the high-noise expert runs them all
    assert hm.sigma_table(ScheduleContract(source="x", kind="distill", family="wan2.1", cfg=1.0)) is None


def test_each_expert_must_sample_its_part_of_the_table():
    high = hm.HostContract(LIGHTX2V, hm.PART_HIGH, switch_step=2)
    low = hm.HostContract(LIGHTX2V, hm.PART_LOW, switch_step=2)
    assert hs.check_sampling([high], _run(TABLE[:3], 1.0)) == []
    assert hs.check_sampling([low], _run(TABLE[2:], 1.0)) == []
    with pytest.raises(ContractError) as wrong_part:
        hs.check_sampling([high], _run(TABLE[2:], 1.0))
    message = str(wrong_part.value)
    assert LIGHTX2V.source in message and "steps/sigmas" in message and "high-noise part" in message


@pytest.mark.parametrize("sigmas, cfg, field", [
    (shifted_sigmas(20, 5.0), 1.0, "steps/sigmas"),
    (TABLE, 5.0, "cfg must be 1"),
    ([s + 2e-4 for s in TABLE[:-1]] + [0.0], 1.0, "steps/sigmas"),  # just over the 1e-4 tolerance
])
def test_a_run_off_the_contract_is_refused_naming_the_file_and_the_field(sigmas, cfg, field):
    with pytest.raises(ContractError) as refused:
        hs.check_sampling([hm.HostContract(LIGHTX2V, hm.PART_ALL)], _run(sigmas, cfg))
    assert LIGHTX2V.source in str(refused.value) and field in str(refused.value)


def test_a_single_lora_accepts_any_contiguous_part_and_float32_noise():
    record = hm.HostContract(LIGHTX2V)  # PART_ANY: LoraBindLoRA on one model
    assert hs.check_sampling([record], _run([s + 5e-5 for s in TABLE[1:4]], 1.0)) == []
    with pytest.raises(ContractError, match="no part of its 4-step table"):
        hs.check_sampling([record], _run([1.0, 0.5, 0.0], 1.0))


def test_enforce_contract_off_samples_anyway_and_returns_the_override_line():
    record = hm.HostContract(LIGHTX2V, hm.PART_ALL, enforced=False)
    (line,) = hs.check_sampling([record], _run(TABLE, 5.0))
    assert LIGHTX2V.source in line and "not enforced" in line and "cfg must be 1" in line
    assert "NOT enforced" in record.describe()


def _deltas(kind):
    return {"diffusion_model.blocks.0.self_attn.q.weight": SimpleNamespace(deltas=(SimpleNamespace(kind=kind),))}


def test_a_dora_lora_after_another_lora_on_the_same_weights_is_refused_naming_file_and_key():
    patched = {"diffusion_model.blocks.0.self_attn.q.weight"}
    with pytest.raises(LoraBindError) as refused:
        hm.check_stacking(_deltas("dora"), patched, "style_dora.safetensors", "LoraBindLoRA")
    message = str(refused.value)
    assert "style_dora.safetensors" in message and "blocks.0.self_attn.q.weight" in message
    assert "apply style_dora.safetensors first" in message
    hm.check_stacking(_deltas("dora"), set(), "style_dora.safetensors", "LoraBindLoRA")  # first: exact
    hm.check_stacking(_deltas("low_rank"), patched, "x.safetensors", "LoraBindLoRA")  # additive: any order


def test_a_peft_folder_on_a_host_model_gets_every_peft_scale_rule_and_says_which(tiny_models_root):
    """rsLoRA, rank_pattern and alpha_pattern on a host denoiser known by its native names (what LoraBindPEFTAdapter
    hands over from ComfyUI's MODEL): each host weight's delta has PEFT's scale, and the node's text names the rule."""
    from safetensors import safe_open

    from comfy_patcher_cases import expected_peft_scale, write_peft_scaling_folder
    from lorabind.loaders.families.wan.key_layouts import WAN_TRANSFORMER

    weights = tiny_models_root / "diffusers" / "tiny-wan21-t2v" / "transformer" / "diffusion_pytorch_model.safetensors"
    with safe_open(str(weights), "pt") as handle:
        diffusers_shapes = {key: tuple(handle.get_slice(key).get_shape()) for key in handle.keys()}
    native = {key: f"diffusion_model.{WAN_TRANSFORMER.to_native(key)}" for key in diffusers_shapes}
    module_of = {native[key]: key.rsplit(".", 1)[0] for key in diffusers_shapes}  # host key -> diffusers module
    shapes = {native[key]: shape for key, shape in diffusers_shapes.items()}
    name = write_peft_scaling_folder(tiny_models_root)
    prepared = hm.prepare_host_lora(shapes, "tiny-wan21", name, str(tiny_models_root / "loras" / name), 1.0,
                                    lenient=False, where="test")
    assert len(prepared.deltas) == 16 and prepared.report["counts"]["unmatched"] == 0
    scales = {module_of[key]: patch.deltas[0].scale for key, patch in prepared.deltas.items()}
    assert scales == pytest.approx({module: expected_peft_scale(module) for module in scales})
    assert {round(s, 4) for s in scales.values()} == {1.5, 8.0, 11.3137}
    (line,) = [text for text in prepared.text if text.startswith("PEFT scale")]
    assert line == ("PEFT scale = alpha/sqrt(r) (rsLoRA): r=4, lora_alpha=16, 1 rank_pattern entry, 1 alpha_pattern "
                    "entry; module scales 1.5 to 11.3137")


def test_a_host_samplers_long_sigmas_are_quoted_by_their_ends():
    """A ComfyUI sampler may run 10,000 steps: the refusal quotes a few values and the length, not the list."""
    with pytest.raises(ContractError) as refused:
        hs.check_sampling([hm.HostContract(LIGHTX2V, hm.PART_ALL)], _run(shifted_sigmas(10_000, 5.0), 1.0))
    message = str(refused.value)
    assert "(10001 points)" in message and len(message) < 600


def test_a_swapped_pair_is_refused_in_the_nodes_words_not_the_components():
    """A ComfyUI user sees the pair node's ``model_high`` / ``model_low`` and ``lora_high`` / ``lora_low`` inputs;
    diffusers' ``transformer`` / ``transformer_2`` mean nothing there."""
    high, low = LIGHTX2V.source, LIGHTX2V.source.replace("high_noise", "low_noise")
    hm.check_expert_pair("wan2.2_moe", high, low, "LoraBindLoRAPair")  # the right way round: no refusal
    with pytest.raises(LoraBindError) as refused:
        hm.check_expert_pair("wan2.2_moe", low, high, "LoraBindLoRAPair")
    message = str(refused.value)
    assert "(the pair is swapped)" in message
    assert f"{low} says low noise but goes into model_high (LoraBindLoRAPair lora_high)" in message
    assert f"{high} says high noise but goes into model_low (LoraBindLoRAPair lora_low)" in message
    assert message.endswith("put high-noise files into model_high and low-noise files into model_low")
    assert "transformer" not in message
