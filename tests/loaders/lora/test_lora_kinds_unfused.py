"""LoHa and LoKr run unfused through peft's tuners: the adapter adds exactly the delta a fuse would (the published
formula, float64 reference), at the bind's strength, and leaves the base weights untouched."""

import pytest
import torch
from safetensors.torch import save_file

from lorabind.loaders.binding.peft_adapters import AdapterCache, AdapterError, to_peft_groups
from lorabind.loaders.families import family_by_id
from lorabind.loaders.lora import account, map_to_model, read_lora

# kohya/LyCORIS-flattened module name -> diffusers module path on the tiny Wan expert
MODULES = {"blocks_0_self_attn_q": "blocks.0.attn1.to_q", "blocks_1_ffn_2": "blocks.1.ffn.net.2"}
ALPHA, RANK = 2.0, 4


def _write_loha(tmp_path, model, tucker_conv: bool = False):
    g = torch.Generator().manual_seed(11)
    sd = {}
    for name, path in MODULES.items():
        out, inp = model.get_submodule(path).weight.shape
        for factor, shape in (("hada_w1_a", (out, RANK)), ("hada_w1_b", (RANK, inp)), ("hada_w2_a", (out, RANK)),
                              ("hada_w2_b", (RANK, inp))):
            sd[f"lora_unet_{name}.{factor}"] = torch.randn(*shape, generator=g) * 0.1
        sd[f"lora_unet_{name}.alpha"] = torch.tensor(ALPHA)
    file = tmp_path / "style_loha.safetensors"
    save_file(sd, str(file))
    return file, sd


def _reference(sd, name):
    """LyCORIS/ComfyUI LoHa: (w1a @ w1b) * (w2a @ w2b) * alpha / rank, float64."""
    t = {k.rsplit(".", 1)[1]: v.double() for k, v in sd.items() if k.startswith(f"lora_unet_{name}.")}
    return (t["hada_w1_a"] @ t["hada_w1_b"]) * (t["hada_w2_a"] @ t["hada_w2_b"]) * ALPHA / RANK


def test_loha_runs_unfused_through_peft_with_the_fused_delta(wan22_expert, tmp_path):
    file, sd = _write_loha(tmp_path, wan22_expert)
    groups = _assert_unfused_equals_fused(wan22_expert, file, sd, _reference, "loha")
    assert [(g.rank, g.modules) for g in groups] == [(RANK, tuple(sorted(MODULES.values())))]


def test_a_loha_with_a_bias_diff_is_refused_unfused_naming_the_module(wan22_expert, tmp_path):
    file, sd = _write_loha(tmp_path, wan22_expert)
    sd["lora_unet_blocks_0_self_attn_q.diff_b"] = torch.ones(wan22_expert.get_submodule("blocks.0.attn1.to_q").weight.shape[0])
    save_file(sd, str(file))
    acc = account(map_to_model(read_lora(str(file)), "wan2.1", family_by_id("wan2.1")), wan22_expert)
    with pytest.raises(AdapterError, match=r"'style_loha\.safetensors': 'blocks\.0\.attn1\.to_q' has a bias diff, which "
                                           r"a dynamic loha adapter cannot carry"):
        to_peft_groups(acc.applied, file.name)


def _write_lokr(tmp_path, model, w2_factored: bool):
    """LoKr as LyCORIS splits it with factor 2 (peft's ``factorization(dim, 2)``): w1 [2, 2]; w2 full, or factored
    at rank 4 (< half of w2's larger side, so peft factors it too)."""
    g = torch.Generator().manual_seed(5)
    sd = {}
    for name, path in MODULES.items():
        out, inp = model.get_submodule(path).weight.shape
        pre = f"lora_unet_{name}"
        sd[f"{pre}.lokr_w1"] = torch.randn(2, 2, generator=g) * 0.3
        if w2_factored:
            sd[f"{pre}.lokr_w2_a"] = torch.randn(out // 2, RANK, generator=g) * 0.3
            sd[f"{pre}.lokr_w2_b"] = torch.randn(RANK, inp // 2, generator=g) * 0.3
            sd[f"{pre}.alpha"] = torch.tensor(ALPHA)
        else:
            sd[f"{pre}.lokr_w2"] = torch.randn(out // 2, inp // 2, generator=g) * 0.3
    file = tmp_path / f"lokr_{'factored' if w2_factored else 'full'}.safetensors"
    save_file(sd, str(file))
    return file, sd


def _lokr_reference(sd, name):
    """LyCORIS/ComfyUI LoKr: kron(w1, w2) · alpha / rank when w2 is factored, · 1 when both are full; float64."""
    t = {k.rsplit(".", 1)[1]: v.double() for k, v in sd.items() if k.startswith(f"lora_unet_{name}.")}
    if "lokr_w2" in t:
        return torch.kron(t["lokr_w1"], t["lokr_w2"])
    return torch.kron(t["lokr_w1"], t["lokr_w2_a"] @ t["lokr_w2_b"]) * ALPHA / RANK


def _assert_unfused_equals_fused(model, file, sd, reference, kind):
    """At scale 0.7 each target layer computes ``x @ (W + 0.7·ΔW)ᵀ + b`` with the float64 reference ΔW; at scale 0
    exactly the base layer; after unloading, the model's state dict is the original one."""
    acc = account(map_to_model(read_lora(str(file)), "wan2.1", family_by_id("wan2.1")), model)
    groups = to_peft_groups(acc.applied, file.name)
    assert {g.kind for g in groups} == {kind}
    before = {k: v.clone() for k, v in model.state_dict().items()}
    cache = AdapterCache({"transformer": model})
    key = (str(file), "transformer")
    try:
        cache.ensure(key, "transformer", groups, file.name)
        cache.activate({key: 0.7})
        for name, path in MODULES.items():
            layer = model.get_submodule(path)
            base = layer.get_base_layer()
            x = torch.randn(3, base.in_features, generator=torch.Generator().manual_seed(2))
            expected = x.double() @ (base.weight.double() + 0.7 * reference(sd, name)).T + base.bias.double()
            with torch.no_grad():
                got = layer(x).double()
            assert (got - expected).abs().max().item() < 1e-5, path
        cache.activate({key: 0.0})
        layer = model.get_submodule(MODULES["blocks_0_self_attn_q"])
        x = torch.randn(3, layer.get_base_layer().in_features, generator=torch.Generator().manual_seed(4))
        with torch.no_grad():
            assert torch.equal(layer(x), layer.get_base_layer()(x))
    finally:
        cache.remove_all()
    after = model.state_dict()
    assert after.keys() == before.keys() and all(torch.equal(after[k], before[k]) for k in before)
    return groups


@pytest.mark.parametrize("w2_factored", [True, False])
def test_lokr_runs_unfused_through_peft_with_the_fused_delta(wan22_expert, tmp_path, w2_factored):
    file, sd = _write_lokr(tmp_path, wan22_expert, w2_factored)
    _assert_unfused_equals_fused(wan22_expert, file, sd, _lokr_reference, "lokr")


def test_a_lokr_split_peft_cannot_make_is_refused_naming_the_shapes(wan22_expert, tmp_path):
    file, sd = _write_lokr(tmp_path, wan22_expert, w2_factored=False)
    for name, path in MODULES.items():  # w1 [3, 2]: no one decompose factor splits 24 as 3·8 and the inputs as 2·k
        out, inp = wan22_expert.get_submodule(path).weight.shape
        sd[f"lora_unet_{name}.lokr_w1"] = torch.ones(3, 2)
        sd[f"lora_unet_{name}.lokr_w2"] = torch.ones(out // 3, inp // 2)
    save_file(sd, str(file))
    acc = account(map_to_model(read_lora(str(file)), "wan2.1", family_by_id("wan2.1")), wan22_expert)
    with pytest.raises(AdapterError, match=r"'blocks\.0\.attn1\.to_q': its Kronecker factors \(3x2 ⊗ 8x12, rank 0\) "
                                           r"are not a split peft's LoKr tuner makes"):
        to_peft_groups(acc.applied, file.name)
