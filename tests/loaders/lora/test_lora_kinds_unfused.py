"""LoHa runs unfused through peft's LoHa tuner: the adapter adds exactly the delta a fuse would (the published
formula, float64 reference), at the bind's strength, and leaves the base weights untouched."""

import pytest
import torch
from safetensors.torch import save_file

from lorabind.loaders.lora import account, map_to_model, read_lora
from lorabind.loaders.peft_adapters import AdapterCache, AdapterError, to_peft_groups

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
    acc = account(map_to_model(read_lora(str(file)), "wan2.1"), wan22_expert)
    groups = to_peft_groups(acc.applied, file.name)
    assert [(g.kind, g.rank, g.modules) for g in groups] == [("loha", RANK, tuple(sorted(MODULES.values())))]
    before = {k: v.clone() for k, v in wan22_expert.state_dict().items()}
    cache = AdapterCache({"transformer": wan22_expert})
    key = (str(file), "transformer")
    try:
        cache.ensure(key, "transformer", groups, file.name)
        cache.activate({key: 0.7})
        x = torch.randn(3, 24, generator=torch.Generator().manual_seed(2))
        for name, path in MODULES.items():
            layer = wan22_expert.get_submodule(path)
            base = layer.get_base_layer()
            x_in = torch.randn(3, base.in_features, generator=torch.Generator().manual_seed(2))
            expected = x_in.double() @ (base.weight.double() + 0.7 * _reference(sd, name)).T + base.bias.double()
            with torch.no_grad():
                got = layer(x_in).double()
            assert (got - expected).abs().max().item() < 1e-5, path
        cache.activate({key: 0.0})  # off: exactly the base layer again
        layer = wan22_expert.get_submodule(MODULES["blocks_0_self_attn_q"])
        with torch.no_grad():
            assert torch.equal(layer(x), layer.get_base_layer()(x))
    finally:
        cache.remove_all()
    after = wan22_expert.state_dict()
    assert after.keys() == before.keys() and all(torch.equal(after[k], before[k]) for k in before)


def test_a_loha_with_a_bias_diff_is_refused_unfused_naming_the_module(wan22_expert, tmp_path):
    file, sd = _write_loha(tmp_path, wan22_expert)
    sd["lora_unet_blocks_0_self_attn_q.diff_b"] = torch.ones(wan22_expert.get_submodule("blocks.0.attn1.to_q").weight.shape[0])
    save_file(sd, str(file))
    acc = account(map_to_model(read_lora(str(file)), "wan2.1"), wan22_expert)
    with pytest.raises(AdapterError, match=r"'style_loha\.safetensors': 'blocks\.0\.attn1\.to_q' has a bias diff, which "
                                           r"a dynamic loha adapter cannot carry"):
        to_peft_groups(acc.applied, file.name)
