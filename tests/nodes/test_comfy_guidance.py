"""Issue 57: the cfg contract where ComfyUI applies guidance, without ComfyUI. What ``nodes/comfy_guidance.py`` reads
from ComfyUI's guiders, samplers and model-option hooks (stood in by classes and functions named and placed as
ComfyUI's are), and how ``usecases/host_sampling.py`` holds each reading against a contract: DualCFGGuider's two
scales, a per-step cfg, a guider it cannot read, a guidance hook, a sampler other than the contract's euler. The
single LoRA node's expert check and the expert's family label. Real ComfyUI runs the same in
``test_comfy_native_guiders_real.py``."""

from types import SimpleNamespace

import pytest

from lorabind.loaders.contract_types import ScheduleContract
from lorabind.loaders.contracts.sigmas import shifted_sigmas
from lorabind.loaders.errors import ContractError, KeyMatchError
from lorabind.nodes import comfy_guidance as cg
from lorabind.usecases import host_models as hm
from lorabind.usecases import host_sampling as hs

HIGH = "wan2.2_t2v_A14b_high_noise_lora_rank64_lightx2v_4step_1217.safetensors"
LOW = HIGH.replace("high_noise", "low_noise")
CONTRACT = ScheduleContract(source=HIGH, kind="distill", family="wan2.2_moe", steps=4, shift=5.0, cfg=1.0,
                            sigmas=shifted_sigmas(4, 5.0), scheduler="euler")
TABLE = shifted_sigmas(4, 5.0)
EXTRAS = "/opt/ComfyUI/comfy_extras/"  # ComfyUI names its comfy_extras modules by file path


def _comfy_class(name: str, module: str, **attributes):
    """An object of a class named and placed as one of ComfyUI's (what ``read_guidance`` identifies it by)."""
    cls = type(name, (), {"__module__": module})
    guider = cls()
    vars(guider).update(attributes, model_options={}, original_conds={})
    return guider


def _dual_cfg(cfg_conds: float, cfg_cond2_negative: float, nested: bool = False):
    return _comfy_class("Guider_DualCFG", EXTRAS + "nodes_custom_sampler", cfg=1.0, cfg1=cfg_conds,
                        cfg2=cfg_cond2_negative, nested=nested)


def _run(guidance, sampler="euler") -> hs.HostRun:
    return hs.HostRun(tuple(TABLE), guidance, sampler)


def _refusal(guidance, sampler="euler") -> str:
    with pytest.raises(ContractError) as refused:
        hs.check_sampling([hm.HostContract(CONTRACT)], _run(guidance, sampler))
    return str(refused.value)


def test_dual_cfg_guider_at_3_5_is_refused_naming_the_file_and_cfg_although_its_cfg_field_stays_1():
    """Main read ``guider.cfg`` (1.0 on a DualCFGGuider) and reported "contract enforced" for a cfg 3.5 run."""
    guidance = cg.read_guidance(_dual_cfg(3.5, 3.5), {})
    assert guidance.guider == "DualCFGGuider" and guidance.cfg is None
    message = _refusal(guidance)
    assert message.startswith(f"{HIGH} is a 4-step distill LoRA: cfg must be 1, the sampler uses cfg_conds 3.5, "
                              "cfg_cond2_negative 3.5, style regular (DualCFGGuider)")
    assert "enforce_contract off" in message


@pytest.mark.parametrize("first, second, nested, cfg", [
    (1.0, 1.0, False, 1.0), (1.0, 1.0, True, 1.0),  # both scales 1: the positive prediction alone
    (3.5, 1.0, False, 3.5),  # the second at 1: plain cfg 3.5 with cond2 as the negative
    (1.0, 3.5, True, None),  # no single cfg
])
def test_dual_cfg_guider_amounts_to_one_cfg_only_when_its_second_scale_is_1(first, second, nested, cfg):
    assert cg.read_guidance(_dual_cfg(first, second, nested), {}).cfg == cfg
    if cfg == 1.0:
        assert hs.check_sampling([hm.HostContract(CONTRACT)], _run(cg.read_guidance(_dual_cfg(first, second), {}))) \
            == []


def test_core_guiders_are_read_by_class_and_module_and_any_other_is_refused_by_name():
    cfg = _comfy_class("CFGGuider", "comfy.samplers", cfg=5.0)
    basic = _comfy_class("Guider_Basic", EXTRAS + "nodes_custom_sampler", cfg=1.0)
    perp = _comfy_class("Guider_PerpNeg", EXTRAS + "nodes_perpneg", cfg=1.0, neg_scale=1.0)
    assert cg.read_guidance(cfg, {}).cfg == 5.0 and cg.read_guidance(basic, {}).cfg == 1.0
    assert cg.read_guidance(perp, {}).cfg is None  # a perpendicular negative is not plain cfg
    assert "neg_scale 1 (PerpNegGuider)" in _refusal(cg.read_guidance(perp, {}))
    vars(perp)["neg_scale"] = 0.0
    assert cg.read_guidance(perp, {}).cfg == 1.0
    # a class of a core name from a custom pack, and a guider class of its own: not trusted
    for guider in (_comfy_class("Guider_DualCFG", "custom_nodes.fancy.guiders"),
                   _comfy_class("FancyGuider", "custom_nodes.fancy.guiders", cfg=1.0)):
        guidance = cg.read_guidance(guider, {})
        assert guidance.unreadable
        message = _refusal(guidance)
        assert f"the sampler's guider {type(guider).__qualname__} (from guiders) is one lorabind cannot read" in message


def test_a_model_option_hook_that_changes_the_guided_prediction_is_refused_by_the_name_of_its_node():
    def cfg_norm(args):
        return args["denoised"]

    cfg_norm.__qualname__ = "CFGNorm.execute.<locals>.cfg_norm"
    options = {"sampler_post_cfg_function": [cfg_norm], "transformer_options": {}}
    guidance = cg.read_guidance(_comfy_class("CFGGuider", "comfy.samplers", cfg=1.0), options)
    assert guidance.hooks == ("CFGNorm's sampler_post_cfg_function (cfg_norm)",)
    message = _refusal(guidance)
    assert HIGH in message and "cfg must be 1, and the model carries CFGNorm's sampler_post_cfg_function (cfg_norm)" \
        in message
    unenforced = hm.HostContract(CONTRACT, enforced=False)
    (line,) = hs.check_sampling([unenforced], _run(guidance))
    assert "not enforced" in line


def test_a_per_step_cfg_is_refused_at_its_step_and_an_unenforced_one_is_recorded_once_per_override():
    """CFGOverride sets ``guider.cfg`` inside a predict-noise wrapper, step by step: the step check reads it."""
    record = hm.HostContract(CONTRACT)
    assert hs.check_step([record], hs.plain_cfg(1.0), 1.0) == []
    with pytest.raises(ContractError) as refused:
        hs.check_step([record], hs.plain_cfg(3.5), 0.9375)
    assert str(refused.value).startswith(f"{HIGH} is a 4-step distill LoRA: cfg must be 1, the sampler uses cfg 3.5 "
                                         "at the step from sigma 0.9375.")
    off = hm.HostContract(CONTRACT, enforced=False)
    assert hs.check_step([off], hs.plain_cfg(3.5), 0.9375) == hs.check_step([off], hs.plain_cfg(3.5), 0.625)


def _ksampler(function_name: str, **extra_options):
    function = SimpleNamespace(__name__=function_name)
    return SimpleNamespace(sampler_function=function, extra_options=extra_options)


@pytest.mark.parametrize("sampler, name", [
    (_ksampler("sample_euler"), "euler"),  # KSampler "euler", and "ddim" (euler with random inpaint noise)
    (_ksampler("sample_dpmpp_2m"), "dpmpp_2m"),
    (_ksampler("sample_euler", s_churn=0.5), "euler (s_churn 0.5)"),  # a stochastic euler is another rule
    (SimpleNamespace(), "SimpleNamespace"),  # not a sampler we can read: named by its class, never euler
])
def test_the_sampler_is_named_as_comfyui_names_it(sampler, name):
    assert cg.sampler_name(sampler) == name


def test_a_sampler_other_than_the_contracts_euler_is_refused_naming_the_file_and_the_sampler():
    message = _refusal(hs.plain_cfg(1.0), sampler="dpmpp_2m")
    assert message.startswith(f"{HIGH} is a 4-step distill LoRA: sampler: it is sampled with euler by its publisher, "
                              "the sampler runs dpmpp_2m (set sampler_name to euler)")
    assert hs.check_sampling([hm.HostContract(CONTRACT)], _run(hs.plain_cfg(1.0), "euler")) == []


def test_the_conditioning_keys_are_the_positive_ones():
    guider = _comfy_class("CFGGuider", "comfy.samplers", cfg=1.0)
    guider.original_conds = {"positive": [{"cross_attn": 0, "minimax_refs": []}], "negative": [{"uuid": 1}]}
    assert cg.condition_keys(guider) == frozenset({"cross_attn", "minimax_refs"})


@pytest.mark.parametrize("model_part, model_file, lora, refused", [
    ("", "wan2.2_t2v_high_noise_14B_fp8_scaled.safetensors", LOW, "its file wan2.2_t2v_high_noise_14B_fp8_scaled"),
    (hm.PART_LOW, "", HIGH, "an earlier LoraBindLoRAPair made it the low-noise expert"),
    ("", "wan2.2_t2v_high_noise_14B_fp8_scaled.safetensors", HIGH, None),
    ("", "wan2.1_t2v_14B_fp8_scaled.safetensors", LOW, None),  # the MODEL does not say: nothing to hold it to
    ("", "", LOW, None),  # ComfyUI 0.3.64 keeps no file name
])
def test_a_single_lora_node_refuses_the_other_experts_file_when_the_model_says_which_expert(model_part, model_file,
                                                                                            lora, refused):
    expert = hm.host_expert("wan2.1", model_part=model_part, model_file=model_file)
    if refused is None:
        assert expert is None or hm.check_lora_expert("wan2.1", lora, "LoraBindLoRA", "lora_name", expert) is None
        return
    with pytest.raises(KeyMatchError) as caught:
        hm.check_lora_expert("wan2.1", lora, "LoraBindLoRA", "lora_name", expert)
    message = str(caught.value)
    assert f"{lora} says {'low' if lora == LOW else 'high'} noise but goes into the" in message
    assert "(LoraBindLoRA lora_name)" in message and refused in message and "transformer" not in message


def test_a_wan22_experts_messages_name_its_family_not_wan21(tiny_models_root):
    """A Wan2.2 A14B expert has a Wan2.1 14B's shapes, so ComfyUI's MODEL read as "wan2.1" in every error."""
    from safetensors import safe_open

    from lorabind.loaders.families.wan.key_layouts import WAN_TRANSFORMER
    from lorabind.tiny_models import lora_fixtures as fixtures

    weights = tiny_models_root / "diffusers" / "tiny-wan22-t2v" / "transformer" / "diffusion_pytorch_model.safetensors"
    with safe_open(str(weights), "pt") as handle:
        shapes = {f"diffusion_model.{WAN_TRANSFORMER.to_native(key)}": tuple(handle.get_slice(key).get_shape())
                  for key in handle.keys()}
    qwen = tiny_models_root / "loras" / fixtures.QWEN_LIGHTNING
    for expert, label in ((False, "(wan2.1)"), (True, "(wan2.2_moe)")):
        with pytest.raises(KeyMatchError) as refused:
            hm.prepare_host_lora(shapes, "LoraBindLoRA model", qwen.name, str(qwen), 1.0, lenient=False,
                                 where="LoraBindLoRA", expert=expert)
        message = str(refused.value)
        assert f"match nothing in the diffusion_model {label}" in message
        # another family's keys: lenient would apply none of them, so it is not offered (nor another node's)
        assert message.endswith("Pick a LoRA made for this model") and "lenient" not in message
