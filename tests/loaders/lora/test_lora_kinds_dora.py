"""DoRA (``kinds/dora.py``): PEFT ``use_dora`` folders fuse to what peft's own ``merge_and_unload`` gives, kohya
``dora_scale`` files to the published formula on either axis; the delta is computed from the base, so stacking
with another LoRA is order-independent and switching is exact; unbind is bit-exact and a fault mid-fuse leaves
the base untouched."""

import copy

import pytest
import torch
from safetensors.torch import save_file

from lorabind.loaders.binding.patching import PatchLayer, WeightPatcher
from lorabind.loaders.families import family_by_id
from lorabind.loaders.lora import account, map_to_model, read_lora
from patching_helpers import assert_fault_mid_fuse_leaves_base

WAN = ("wan2.1", {"blocks_0_self_attn_q": "blocks.0.attn1.to_q", "blocks_1_ffn_2": "blocks.1.ffn.net.2"})
QWEN = ("qwen_image", {"transformer_blocks_0_attn_to_q": "transformer_blocks.0.attn.to_q",
                       "transformer_blocks_1_img_mlp_net_2": "transformer_blocks.1.img_mlp.net.2"})
FAMILIES = {"wan": WAN, "qwen": QWEN}


def _model(request, family):
    return request.getfixturevalue("wan22_expert" if family == "wan" else "qwen_transformer")


def _relative_error(got, expected) -> float:
    return float((got.double() - expected.double()).abs().max() / expected.double().abs().max())


def _fuse(model, file, model_family, strength=1.0, key="dora"):
    acc = account(map_to_model(read_lora(str(file)), model_family, family_by_id(model_family)), model)
    patcher = WeightPatcher({"transformer": model})
    patcher.apply([PatchLayer(key, "transformer", strength, acc.applied)])
    return acc, patcher


# ------------------------------------------------------------------ PEFT use_dora vs peft's merge_and_unload


def _peft_dora_folder(model, modules, folder, seed=0):
    """A DoRA adapter trained-looking by peft itself (random A/B, magnitudes moved off their initial norms),
    saved with ``save_pretrained``; returns the weights peft's ``merge_and_unload`` gives."""
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(seed)
    peft_model = get_peft_model(copy.deepcopy(model), LoraConfig(
        r=4, lora_alpha=8, target_modules=list(modules), use_dora=True, init_lora_weights=False))
    with torch.no_grad():
        for name in modules:
            magnitude = peft_model.base_model.model.get_submodule(name).lora_magnitude_vector["default"].weight
            magnitude.mul_(torch.rand(magnitude.shape) + 0.5)
    peft_model.save_pretrained(str(folder))
    merged = peft_model.merge_and_unload()
    return {name: merged.get_submodule(name).weight.detach().clone() for name in modules}


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_peft_dora_folder_matches_peft_merge_and_unload(request, tmp_path, family):
    model = _model(request, family)
    model_family, modules = FAMILIES[family]
    expected = _peft_dora_folder(model, modules.values(), tmp_path / "dora")
    before = {k: v.detach().clone() for k, v in model.state_dict().items()}
    acc, patcher = _fuse(model, tmp_path / "dora", model_family)
    try:
        assert {p.low_rank.kind for p in acc.applied.values()} == {"dora"}
        assert acc.counts["applied"] == 3 * len(modules)  # lora_A, lora_B, lora_magnitude_vector
        for name, weight in expected.items():
            got = model.get_submodule(name).weight.detach()
            assert _relative_error(got, weight) < 1e-5, name  # float32 on both sides
            assert _relative_error(got, before[f"{name}.weight"]) > 1e-3  # it did change the weight
    finally:
        patcher.restore_all()
    for key, value in model.state_dict().items():
        assert torch.equal(value, before[key]), key


def test_peft_dora_in_bf16_matches_peft_within_bf16_rounding(wan22_expert, tmp_path):
    """On a bf16 model: peft merges in bf16, we compute in float32 from the bf16 base and round once."""
    _, modules = WAN
    model = copy.deepcopy(wan22_expert).to(torch.bfloat16)
    expected = _peft_dora_folder(model, modules.values(), tmp_path / "dora", seed=1)
    before = {k: v.detach().clone() for k, v in model.state_dict().items()}
    _, patcher = _fuse(model, tmp_path / "dora", "wan2.1")
    for name, weight in expected.items():
        got = model.get_submodule(name).weight.detach().float()
        ulp = torch.finfo(torch.bfloat16).eps * weight.float().abs()
        assert bool(((got - weight.float()).abs() <= 2 * ulp + 1e-30).all()), name
    patcher.restore_all()
    for key, value in model.state_dict().items():
        assert torch.equal(value, before[key]), key


# ------------------------------------------------------------------ kohya / LyCORIS dora_scale


def _kohya_dora(model, modules, axis, seed=3, rank=4, alpha=2.0):
    """kohya's layout: lora_down/lora_up/alpha plus ``dora_scale`` [1, in] (its default, per input channel) or
    LyCORIS ``wd_on_out`` [out, 1] (per output channel)."""
    g = torch.Generator().manual_seed(seed)
    sd = {}
    for flat, path in modules.items():
        out, inp = model.get_submodule(path).weight.shape
        pre = f"lora_unet_{flat}"
        sd[f"{pre}.lora_down.weight"] = torch.randn(rank, inp, generator=g) * 0.3
        sd[f"{pre}.lora_up.weight"] = torch.randn(out, rank, generator=g) * 0.3
        sd[f"{pre}.alpha"] = torch.tensor(alpha)
        shape = (1, inp) if axis == "in" else (out, 1)
        sd[f"{pre}.dora_scale"] = torch.rand(shape, generator=g) + 0.5
    return sd


def _dora_reference(sd, flat, base, strength):
    """The published formula in float64: ``W' = dora_scale · (W + ΔW) / ‖W + ΔW‖`` with ``ΔW = up @ down · alpha/r``;
    the norm per input column for a [1, in] scale (ComfyUI ``weight_decompose``, its ``finfo(float32).eps`` included),
    per output row for [out, 1] (peft / the DoRA paper); strength s gives ``W + s · (W' - W)`` (ComfyUI)."""
    pre = f"lora_unet_{flat}."
    t = {k[len(pre):]: v.double() for k, v in sd.items() if k.startswith(pre)}
    base = base.double()
    changed = base + t["lora_up.weight"] @ t["lora_down.weight"] * t["alpha"] / t["lora_down.weight"].shape[0]
    scale = t["dora_scale"]
    if scale.shape[0] == base.shape[0]:
        norm = changed.norm(dim=1, keepdim=True)
    else:
        norm = changed.norm(dim=0, keepdim=True) + torch.finfo(torch.float32).eps
    return base + strength * (changed * (scale / norm) - base)


@pytest.mark.parametrize("axis", ["in", "out"])
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_kohya_dora_scale_fuses_to_the_published_formula(request, tmp_path, family, axis):
    model = _model(request, family)
    model_family, modules = FAMILIES[family]
    sd = _kohya_dora(model, modules, axis)
    save_file(sd, str(tmp_path / "kohya_dora.safetensors"))
    before = {k: v.detach().clone() for k, v in model.state_dict().items()}
    acc, patcher = _fuse(model, tmp_path / "kohya_dora.safetensors", model_family, strength=0.7)
    try:
        assert acc.counts["applied"] == len(sd)
        for flat, path in modules.items():
            expected = _dora_reference(sd, flat, before[f"{path}.weight"], 0.7)
            assert _relative_error(model.get_submodule(path).weight.detach(), expected) < 1e-6, path
    finally:
        patcher.restore_all()
    for key, value in model.state_dict().items():
        assert torch.equal(value, before[key]), key


def _plain_lora(model, modules, seed=9):
    g = torch.Generator().manual_seed(seed)
    sd = {}
    for flat, path in modules.items():
        out, inp = model.get_submodule(path).weight.shape
        sd[f"lora_unet_{flat}.lora_down.weight"] = torch.randn(2, inp, generator=g) * 0.2
        sd[f"lora_unet_{flat}.lora_up.weight"] = torch.randn(out, 2, generator=g) * 0.2
    return sd


def test_dora_stacked_with_a_plain_lora_is_order_independent_and_switches_exactly(wan22_expert, tmp_path):
    _, modules = WAN
    dora_sd, plain_sd = _kohya_dora(wan22_expert, modules, "in"), _plain_lora(wan22_expert, modules)
    save_file(dora_sd, str(tmp_path / "dora.safetensors"))
    save_file(plain_sd, str(tmp_path / "plain.safetensors"))
    dora = account(map_to_model(read_lora(str(tmp_path / "dora.safetensors")), "wan2.1", family_by_id("wan2.1")), wan22_expert).applied
    plain = account(map_to_model(read_lora(str(tmp_path / "plain.safetensors")), "wan2.1", family_by_id("wan2.1")), wan22_expert).applied
    layers = {"dora": PatchLayer("dora", "transformer", 1.0, dora), "plain": PatchLayer("plain", "transformer", 0.5, plain)}
    path = "blocks.0.attn1.to_q"
    weight = wan22_expert.get_submodule(path).weight
    base = weight.detach().clone()
    patcher = WeightPatcher({"transformer": wan22_expert})
    try:
        patcher.apply([layers["dora"]])
        dora_alone = weight.detach().clone()
        patcher.apply([layers["dora"], layers["plain"]])
        both = weight.detach().clone()
        patcher.restore_all()
        patcher.apply([layers["plain"], layers["dora"]])  # the other order, from scratch
        assert torch.equal(weight.detach(), both)
        patcher.apply([layers["dora"]])  # switching the plain LoRA off re-computes from the base
        assert torch.equal(weight.detach(), dora_alone)
        # the DoRA part is normalised on the base, not on base + plain LoRA: the plain delta simply adds
        plain_delta = 0.5 * plain_sd["lora_unet_blocks_0_self_attn_q.lora_up.weight"].double() \
            @ plain_sd["lora_unet_blocks_0_self_attn_q.lora_down.weight"].double()
        expected = _dora_reference(dora_sd, "blocks_0_self_attn_q", base, 1.0) + plain_delta
        assert _relative_error(both, expected) < 1e-6
    finally:
        patcher.restore_all()
    assert torch.equal(weight.detach(), base)


@pytest.mark.parametrize("axis", ["in", "out"])
def test_fault_mid_dora_fuse_leaves_the_base_untouched(wan22_expert, tmp_path, axis):
    _, modules = WAN
    save_file(_kohya_dora(wan22_expert, modules, axis), str(tmp_path / "dora.safetensors"))
    acc = account(map_to_model(read_lora(str(tmp_path / "dora.safetensors")), "wan2.1", family_by_id("wan2.1")), wan22_expert)
    assert_fault_mid_fuse_leaves_base(wan22_expert, acc.applied, "dora")


def test_dora_scale_without_a_delta_is_refused_naming_the_key(tmp_path):
    from lorabind.loaders.errors import LoraFileError

    save_file({"lora_unet_blocks_0_self_attn_q.dora_scale": torch.ones(1, 24)}, str(tmp_path / "lonely.safetensors"))
    with pytest.raises(LoraFileError, match=r"lonely\.safetensors: 'lora_unet_blocks_0_self_attn_q\.dora_scale' "
                                            r"\(dora\) has no weight delta"):
        read_lora(str(tmp_path / "lonely.safetensors"))
