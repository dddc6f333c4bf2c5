"""Adapter kinds (``loaders/lora/kinds``): LyCORIS LoHa and LoKr files fuse to the published formulas, restore
bit-exactly, survive a fault mid-fuse, and a kind registered from a test module works end to end."""

import pytest
import torch
from safetensors.torch import save_file

from lorabind.loaders.binding.patching import PatchLayer, WeightPatcher
from lorabind.loaders.families import family_by_id
from lorabind.loaders.lora import account, kinds, map_to_model, read_lora
from lorabind.loaders.lora.kinds.base import AdapterKind
from patching_helpers import assert_fault_mid_fuse_leaves_base

# kohya/LyCORIS-flattened module name -> diffusers module path, per tiny model
WAN_MODULES = {"blocks_0_self_attn_q": "blocks.0.attn1.to_q", "blocks_1_ffn_2": "blocks.1.ffn.net.2"}
QWEN_MODULES = {"transformer_blocks_0_attn_to_q": "transformer_blocks.0.attn.to_q",
                "transformer_blocks_1_img_mlp_net_2": "transformer_blocks.1.img_mlp.net.2"}


def _randn(g, *shape):
    return torch.randn(*shape, generator=g) * 0.1


def _loha_tensors(g, name, out, inp, rank=4, alpha=2.0):
    return {f"lora_unet_{name}.hada_w1_a": _randn(g, out, rank), f"lora_unet_{name}.hada_w1_b": _randn(g, rank, inp),
            f"lora_unet_{name}.hada_w2_a": _randn(g, out, rank), f"lora_unet_{name}.hada_w2_b": _randn(g, rank, inp),
            f"lora_unet_{name}.alpha": torch.tensor(alpha)}


def _loha_reference(sd, name):
    """LyCORIS/ComfyUI loha: (w1a @ w1b) * (w2a @ w2b) * alpha / rank, in float64."""
    t = {k.rsplit(".", 1)[1]: v.double() for k, v in sd.items() if k.startswith(f"lora_unet_{name}.")}
    return (t["hada_w1_a"] @ t["hada_w1_b"]) * (t["hada_w2_a"] @ t["hada_w2_b"]) * t["alpha"] / t["hada_w1_b"].shape[0]


def _lokr_tensors(g, name, out, inp, factored, alpha=3.0):
    a, c = 2, out // 2
    b, d = 2, inp // 2
    pre = f"lora_unet_{name}"
    sd = {f"{pre}.lokr_w1": _randn(g, a, b), f"{pre}.alpha": torch.tensor(alpha)}
    if factored:
        sd.update({f"{pre}.lokr_w2_a": _randn(g, c, 4), f"{pre}.lokr_w2_b": _randn(g, 4, d)})
    else:
        sd[f"{pre}.lokr_w2"] = _randn(g, c, d)
    return sd


def _lokr_reference(sd, name):
    """LyCORIS/ComfyUI lokr: kron(w1, w2) * alpha / dim when a factor is factored, * 1 when both are full."""
    t = {k.rsplit(".", 1)[1]: v.double() for k, v in sd.items() if k.startswith(f"lora_unet_{name}.")}
    if "lokr_w2" in t:
        return torch.kron(t["lokr_w1"], t["lokr_w2"])
    return torch.kron(t["lokr_w1"], t["lokr_w2_a"] @ t["lokr_w2_b"]) * t["alpha"] / t["lokr_w2_b"].shape[0]


KINDS = {
    "loha": (lambda g, n, o, i: _loha_tensors(g, n, o, i), _loha_reference),
    "lokr-factored": (lambda g, n, o, i: _lokr_tensors(g, n, o, i, True), _lokr_reference),
    "lokr-full": (lambda g, n, o, i: _lokr_tensors(g, n, o, i, False), _lokr_reference),
}


def _write(tmp_path, model, modules, make, tag):
    g = torch.Generator().manual_seed(7)
    sd = {}
    for name, path in modules.items():
        out, inp = model.get_submodule(path).weight.shape
        sd.update(make(g, name, out, inp))
    file = tmp_path / f"{tag}.safetensors"
    save_file(sd, str(file))
    return file, sd


def _model(request, family):
    return request.getfixturevalue("wan22_expert" if family == "wan" else "qwen_transformer")


@pytest.mark.parametrize("family", ["wan", "qwen"])
@pytest.mark.parametrize("kind", sorted(KINDS))
def test_fused_delta_matches_float64_reference_and_restores(request, tmp_path, family, kind):
    model = _model(request, family)
    modules = WAN_MODULES if family == "wan" else QWEN_MODULES
    make, reference = KINDS[kind]
    file, sd = _write(tmp_path, model, modules, make, kind)
    acc = account(map_to_model(read_lora(str(file)), "wan2.1" if family == "wan" else "qwen_image", family_by_id("wan2.1" if family == "wan" else "qwen_image")), model)
    assert acc.counts["applied"] == len(sd) and not acc.unmatched
    assert {p.low_rank.kind for p in acc.applied.values()} == {kind.split("-")[0]}
    before = {k: v.detach().clone() for k, v in model.state_dict().items()}
    patcher = WeightPatcher({"transformer": model})
    patcher.apply([PatchLayer(kind, "transformer", 0.5, acc.applied)])
    try:
        for name, path in modules.items():
            base = before[f"{path}.weight"].double()
            expected = base + 0.5 * reference(sd, name)
            got = model.get_submodule(path).weight.detach().double()
            assert torch.allclose(got, expected, rtol=1e-6, atol=1e-7), (kind, path)
            assert not torch.equal(got, base)
    finally:
        patcher.restore_all()
    for key, value in model.state_dict().items():
        assert torch.equal(value, before[key]), key


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_fault_mid_fuse_leaves_base_untouched(wan22_expert, tmp_path, kind):
    make, _ = KINDS[kind]
    file, _ = _write(tmp_path, wan22_expert, WAN_MODULES, make, kind)
    acc = account(map_to_model(read_lora(str(file)), "wan2.1", family_by_id("wan2.1")), wan22_expert)
    assert_fault_mid_fuse_leaves_base(wan22_expert, acc.applied, kind)


class _SignDelta:
    """The toy kind's delta: ``scale · sign(s)`` for a full-size tensor ``s`` (key suffix ``.toy_sign``)."""

    kind, alpha, scale, rank = "toy", None, 0.25, 0

    def __init__(self, tensor):
        self.tensor = tensor

    def delta_shape(self, weight_shape):
        return tuple(self.tensor.shape) if tuple(self.tensor.shape) == tuple(weight_shape) else None

    def tensors(self):
        return [self.tensor]

    def row_adder(self, device, base_rows):
        signs = torch.sign(self.tensor.to(device=device, dtype=torch.float32))
        return lambda chunk, start, stop, strength: chunk.add_(signs[start:stop], alpha=strength * self.scale)


TOY = AdapterKind(name="toy", suffix_parts=((".toy_sign", "toy_sign"),),
                  build=lambda module, parts, tensors, name, peft: _SignDelta(tensors[parts["toy_sign"]]))


def test_a_kind_registered_from_a_test_module_binds_and_unbinds(wan22_expert, tmp_path):
    weight = wan22_expert.get_submodule("blocks.0.attn1.to_q").weight
    g = torch.Generator().manual_seed(3)
    file = tmp_path / "toy.safetensors"
    save_file({"lora_unet_blocks_0_self_attn_q.toy_sign": torch.randn(weight.shape, generator=g)}, str(file))
    before = weight.detach().clone()
    kinds.register(TOY)
    try:
        acc = account(map_to_model(read_lora(str(file)), "wan2.1", family_by_id("wan2.1")), wan22_expert)
        patcher = WeightPatcher({"transformer": wan22_expert})
        patcher.apply([PatchLayer("toy", "transformer", 2.0, acc.applied)])
        signs = torch.sign(torch.randn(weight.shape, generator=torch.Generator().manual_seed(3)))
        assert torch.equal(weight.detach(), (before + 0.5 * signs).to(weight.dtype))
        patcher.restore_all()
        assert torch.equal(weight.detach(), before)
    finally:
        kinds.unregister("toy")
    assert kinds.kind_for({"toy_sign"}) is None


def test_dynamic_use_of_a_fused_only_kind_says_which_kinds_run_unfused(wan22_expert, tmp_path):
    from lorabind.loaders.binding.peft_adapters import AdapterError, to_peft_groups

    weight = wan22_expert.get_submodule("blocks.0.attn1.to_q").weight
    file = tmp_path / "toy.safetensors"
    save_file({"lora_unet_blocks_0_self_attn_q.toy_sign": torch.ones(weight.shape)}, str(file))
    kinds.register(TOY)  # a kind without a PeftForm runs fused only
    try:
        acc = account(map_to_model(read_lora(str(file)), "wan2.1", family_by_id("wan2.1")), wan22_expert)
        with pytest.raises(AdapterError, match=r"'toy\.safetensors': 'blocks\.0\.attn1\.to_q' is a toy adapter, "
                                               r"which must be fused: adapter kinds that run unfused are lora, loha, "
                                               r"lokr; dora, toy, diff run fused only — load it with the "
                                               r"FuseDistillLoRA node"):
            to_peft_groups(acc.applied, "toy.safetensors")
    finally:
        kinds.unregister("toy")