"""Every prefix × every factor spelling of the issue, on both tiny models: zero unmatched keys, same patches.

The single-layout tests pin individual names; this matrix catches a combination that breaks (e.g. kohya
``lora_unet_`` names with ``_lora.down`` factors, or ``base_model.model.`` on native Wan names). Each variant is
the same LoRA re-spelled, so its factors, scales and diffs must equal the reference file's bit for bit.
"""

import pytest
import torch

from formats_helpers import qwen_lora, save, wan_native_lora
from lorabind.loaders.families import family_by_id
from lorabind.loaders.lora import account, clear_lora_cache, map_to_model, read_lora

FACTOR_SPELLINGS = {
    "lora_down/lora_up": (".lora_down.weight", ".lora_up.weight"),
    "lora_A/lora_B": (".lora_A.weight", ".lora_B.weight"),
    "lora.down/lora.up": (".lora.down.weight", ".lora.up.weight"),
    "_lora.down/_lora.up": ("_lora.down.weight", "_lora.up.weight"),
    "lora_A.default/lora_B.default": (".lora_A.default.weight", ".lora_B.default.weight"),
}
PREFIXES = ("", "diffusion_model.", "transformer.", "base_model.model.", "model.diffusion_model.", "lora_unet_")
_OTHER_SUFFIXES = (".alpha", ".diff_b", ".diff_m", ".diff")


def respell(sd: dict, strip: str, prefix: str, factors: tuple) -> dict:
    """``sd`` (lora_down/lora_up names after ``strip``) with another prefix and factor spelling; ``lora_unet_``
    flattens the module path's dots to underscores as kohya/musubi do."""
    out = {}
    for key, value in sd.items():
        body = key[len(strip):] if key.startswith(strip) else key
        if body.endswith(".lora_down.weight"):
            module, suffix = body[: -len(".lora_down.weight")], factors[0]
        elif body.endswith(".lora_up.weight"):
            module, suffix = body[: -len(".lora_up.weight")], factors[1]
        else:
            suffix = next(s for s in _OTHER_SUFFIXES if body.endswith(s))
            module = body[: -len(suffix)]
        if prefix == "lora_unet_":
            module = module.replace(".", "_")
        out[prefix + module + suffix] = value
    return out


def canonical(applied: dict) -> dict:
    """{(module, part): tensor or scale} of accounted targets: the factors, their scale and every diff."""
    out = {}
    for module, patch in applied.items():
        if patch.low_rank is not None:
            out.update({(module, "down"): patch.low_rank.down, (module, "up"): patch.low_rank.up,
                        (module, "scale"): torch.tensor(patch.low_rank.scale)})
        out.update({(module, param): diff for param, diff in patch.param_diffs.items()})
    return out


def _check_family(tmp_path, model, family, sd, strip):
    clear_lora_cache()
    reference = account(map_to_model(read_lora(save(sd, tmp_path / "reference.safetensors")), family, family_by_id(family)), model)
    expected = canonical(reference.applied)
    failures = []
    for prefix in PREFIXES:
        for spelling, factors in FACTOR_SPELLINGS.items():
            variant = respell(sd, strip, prefix, factors)
            name = f"{prefix or 'bare'}{spelling.replace('/', '-')}.safetensors"
            acc = account(map_to_model(read_lora(save(variant, tmp_path / name)), family, family_by_id(family)), model)
            got = canonical(acc.applied)
            if acc.counts != {"applied": len(variant), "expected_unmatched": 0, "unmatched": 0} or (
                    got.keys() != expected.keys() or not all(torch.equal(got[k], v) for k, v in expected.items())):
                failures.append((prefix, spelling, acc.counts))
    assert failures == []
    return reference


@pytest.mark.slow
def test_every_wan_spelling_applies_every_tensor(tmp_path, wan22_expert):
    # the reference covers diff, diff_b, diff_m, norm diffs, conv pairs and alpha on non-block layers
    reference = _check_family(tmp_path, wan22_expert, "wan2.2_moe", wan_native_lora(seed=9), "diffusion_model.")
    assert {"blocks.0", "", "blocks.1.norm2", "patch_embedding", "proj_out"} <= set(reference.applied)


def test_every_qwen_spelling_applies_every_tensor(tmp_path, qwen_transformer):
    sd = qwen_lora(alpha=8.0, seed=9)
    # norm diffs and bias diffs too (the qk norms, the text-input norm, a bias delta)
    g = torch.Generator().manual_seed(2)
    for name in ("transformer_blocks.0.attn.norm_q", "transformer_blocks.1.attn.norm_added_k", "txt_norm"):
        shape = qwen_transformer.get_submodule(name).weight.shape
        sd[f"{name}.diff"] = torch.randn(shape, generator=g) * 0.01
    sd["transformer_blocks.0.img_mod.1.diff_b"] = torch.randn(6 * 48, generator=g) * 0.01
    reference = _check_family(tmp_path, qwen_transformer, "qwen_image", sd, "")
    assert set(reference.applied["txt_norm"].param_diffs) == {"weight"}
