"""Tucker cores of LyCORIS conv adapters (LoHa ``hada_t1``/``hada_t2``, LoKr ``lokr_t2``) and LoKr conv factors:
fused exactly to the published contraction, in the layouts LyCORIS writes for conv layers (the Wan patch
embedding, a Conv3d, end to end; Conv2d through the kind's delta directly)."""

import pytest
import torch
from safetensors.torch import save_file

from lorabind.loaders.binding.patching import PatchLayer, WeightPatcher
from lorabind.loaders.errors import LoraFileError
from lorabind.loaders.families import family_by_id
from lorabind.loaders.lora import account, map_to_model, read_lora
from lorabind.loaders.lora.kinds import by_name

RANK = 3


def _cp(t, wb, wa):
    """ComfyUI ``comfy/weight_adapter/loha.py`` / ``lokr.py``: ``einsum('i j k l, j r, i p -> p r k l', t, wb, wa)``
    (LyCORIS ``make_weight_cp``), written for any number of kernel dimensions, in float64."""
    return torch.einsum("i j ..., j r, i p -> p r ...", t.double(), wb.double(), wa.double()).contiguous()


def _loha_tucker(g, pre, out, inp, kernel, alpha=2.0):
    r = RANK
    return {f"{pre}.hada_w1_a": torch.randn(r, out, generator=g), f"{pre}.hada_w1_b": torch.randn(r, inp, generator=g),
            f"{pre}.hada_w2_a": torch.randn(r, out, generator=g), f"{pre}.hada_w2_b": torch.randn(r, inp, generator=g),
            f"{pre}.hada_t1": torch.randn(r, r, *kernel, generator=g),
            f"{pre}.hada_t2": torch.randn(r, r, *kernel, generator=g), f"{pre}.alpha": torch.tensor(alpha)}


def _loha_tucker_reference(sd, pre):
    """LoHa with Tucker: ``cp(t1, w1b, w1a) * cp(t2, w2b, w2a) * alpha / hada_w1_b.shape[0]``."""
    t = {k[len(pre) + 1:]: v for k, v in sd.items() if k.startswith(pre + ".")}
    return (_cp(t["hada_t1"], t["hada_w1_b"], t["hada_w1_a"]) * _cp(t["hada_t2"], t["hada_w2_b"], t["hada_w2_a"])
            * float(t["alpha"]) / t["hada_w1_b"].shape[0])


def _lokr_tucker(g, pre, out, inp, kernel, alpha=6.0):
    r, a, b = RANK, 2, 2
    return {f"{pre}.lokr_w1": torch.randn(a, b, generator=g), f"{pre}.lokr_w2_a": torch.randn(r, out // a, generator=g),
            f"{pre}.lokr_w2_b": torch.randn(r, inp // b, generator=g),
            f"{pre}.lokr_t2": torch.randn(r, r, *kernel, generator=g), f"{pre}.alpha": torch.tensor(alpha)}


def _lokr_tucker_reference(sd, pre):
    """LoKr with Tucker: ``kron(w1[:, :, None, ...], cp(t2, w2_b, w2_a)) * alpha / lokr_w2_b.shape[0]``."""
    t = {k[len(pre) + 1:]: v for k, v in sd.items() if k.startswith(pre + ".")}
    w2 = _cp(t["lokr_t2"], t["lokr_w2_b"], t["lokr_w2_a"])
    w1 = t["lokr_w1"].double().reshape(*t["lokr_w1"].shape, *[1] * (w2.dim() - 2))
    return torch.kron(w1, w2) * float(t["alpha"]) / t["lokr_w2_b"].shape[0]


def _lokr_conv_factored(g, pre, out, inp, kernel, alpha=6.0):
    """LyCORIS conv LoKr without Tucker: ``lokr_w2_b`` is [r, d·k] (the kernel flattened into it)."""
    k = int(torch.tensor(kernel).prod())
    return {f"{pre}.lokr_w1_a": torch.randn(2, RANK, generator=g), f"{pre}.lokr_w1_b": torch.randn(RANK, 2, generator=g),
            f"{pre}.lokr_w2_a": torch.randn(out // 2, RANK, generator=g),
            f"{pre}.lokr_w2_b": torch.randn(RANK, inp // 2 * k, generator=g), f"{pre}.alpha": torch.tensor(alpha)}


def _lokr_conv_factored_reference(sd, pre, kernel):
    t = {k[len(pre) + 1:]: v.double() for k, v in sd.items() if k.startswith(pre + ".")}
    w1 = t["lokr_w1_a"] @ t["lokr_w1_b"]
    w2 = (t["lokr_w2_a"] @ t["lokr_w2_b"]).reshape(t["lokr_w2_a"].shape[0], -1, *kernel)
    return torch.kron(w1.reshape(*w1.shape, *[1] * len(kernel)), w2) * float(t["alpha"]) / t["lokr_w2_b"].shape[0]


CASES = {
    "loha-tucker": (_loha_tucker, lambda sd, pre, kernel: _loha_tucker_reference(sd, pre)),
    "lokr-tucker": (_lokr_tucker, lambda sd, pre, kernel: _lokr_tucker_reference(sd, pre)),
    "lokr-conv-factored": (_lokr_conv_factored, _lokr_conv_factored_reference),
}


def _relative_error(got, expected) -> float:
    return float((got - expected).abs().max() / expected.abs().max())


@pytest.mark.parametrize("case", sorted(CASES))
def test_wan_patch_embedding_conv3d_fuses_to_the_published_contraction(wan22_expert, tmp_path, case):
    weight = wan22_expert.patch_embedding.weight
    out, inp, *kernel = weight.shape
    make, reference = CASES[case]
    sd = make(torch.Generator().manual_seed(11), "lora_unet_patch_embedding", out, inp, kernel)
    file = tmp_path / f"{case}.safetensors"
    save_file(sd, str(file))
    acc = account(map_to_model(read_lora(str(file)), "wan2.1", family_by_id("wan2.1")), wan22_expert)
    assert acc.counts["applied"] == len(sd) and list(acc.applied) == ["patch_embedding"]
    before = weight.detach().clone()
    patcher = WeightPatcher({"transformer": wan22_expert})
    patcher.apply([PatchLayer(case, "transformer", 0.75, acc.applied)])
    try:
        expected = 0.75 * reference(sd, "lora_unet_patch_embedding", kernel)
        got = weight.detach().double() - before.double()
        assert expected.shape == weight.shape
        assert _relative_error(got, expected) < 1e-6, case
    finally:
        patcher.restore_all()
    assert torch.equal(weight.detach(), before)


@pytest.mark.parametrize("case", sorted(CASES))
def test_conv2d_delta_matches_float64_reference(case):
    """A Conv2d [out, in, 3, 3] (the layout LyCORIS trains Tucker on), through the kind's own delta."""
    out, inp, kernel = 8, 6, (3, 3)
    make, reference = CASES[case]
    sd = make(torch.Generator().manual_seed(5), "lycoris_conv", out, inp, kernel)
    parts = {k.rsplit(".", 1)[1]: k for k in sd}
    delta = by_name(case.split("-")[0]).build("conv", parts, sd, "conv.safetensors", None)
    assert delta.delta_shape((out, inp, *kernel)) == (out, inp, *kernel)
    assert delta.delta_shape((out, inp, 1, 9)) is None or case == "lokr-conv-factored"  # flattened factors: only the sizes are known
    chunk = torch.zeros(out, inp * 9)
    add = delta.row_adder("cpu", None)
    add(chunk[:5], 0, 5, 1.0)  # two row chunks, as the patcher does for a large weight
    add(chunk[5:], 5, out, 1.0)
    expected = reference(sd, "lycoris_conv", kernel).reshape(out, -1)
    assert _relative_error(chunk.double(), expected) < 1e-6


def test_loha_with_one_tucker_core_is_refused_naming_the_missing_one(tmp_path):
    sd = _loha_tucker(torch.Generator().manual_seed(1), "lora_unet_patch_embedding", 24, 16, (1, 2, 2))
    del sd["lora_unet_patch_embedding.hada_t2"]
    file = tmp_path / "half.safetensors"
    save_file(sd, str(file))
    with pytest.raises(LoraFileError, match=r"half\.safetensors.*patch_embedding.*hada_t2"):
        read_lora(str(file))


def test_lokr_tucker_core_with_a_full_w2_is_refused(tmp_path):
    g = torch.Generator().manual_seed(1)
    sd = {"lora_unet_patch_embedding.lokr_w1": torch.randn(2, 2, generator=g),
          "lora_unet_patch_embedding.lokr_w2": torch.randn(12, 8, 1, 2, 2, generator=g),
          "lora_unet_patch_embedding.lokr_t2": torch.randn(3, 3, 1, 2, 2, generator=g)}
    file = tmp_path / "both.safetensors"
    save_file(sd, str(file))
    with pytest.raises(LoraFileError, match=r"both\.safetensors.*full lokr_w2 and a Tucker core"):
        read_lora(str(file))
