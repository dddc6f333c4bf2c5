"""Real LightX2V-format files through bind(): every key lands exactly, and where diffusers supports the keys
our fused weights equal diffusers' ``load_lora_adapter`` + ``fuse_lora`` (up to bf16 rounding)."""

from __future__ import annotations

import logging
import warnings

import pytest
import torch
from safetensors.torch import save_file

from lorabind.loaders.binding.bind import bind, unbind
from lorabind.loaders.handles import FuseSpec
from lorabind.loaders.lora import clear_lora_cache
from patching_helpers import assert_bit_identical, expected_value, lightx2v_lora, snapshot


@pytest.fixture(autouse=True)
def _fresh_reader_cache():
    clear_lora_cache()
    yield
    clear_lora_cache()


def test_full_lightx2v_file_fuses_every_key_exactly(make_model, tmp_path):
    model = make_model()
    module = model.components["transformer_2"]
    base = snapshot(module)
    tensors, expected = lightx2v_lora(module, seed=1, full=True)
    path = tmp_path / "wan22_lightx2v_full.safetensors"
    save_file(tensors, str(path))

    report = bind(model, [FuseSpec(str(path), 0.6, "transformer_2")], [])
    state = module.state_dict()
    errors = {name: (state[name].double() - expected_value(base[name], spec, 0.6)).abs().max().item()
              for name, spec in expected.items()}
    assert max(errors.values()) <= 1e-6
    untouched = set(base) - set(expected)
    assert [k for k in untouched if not torch.equal(base[k], state[k])] == []
    assert report.written == len(expected)
    assert report.fuses[0]["accounting"]["counts"] == {"applied": len(tensors), "expected_unmatched": 0,
                                                        "unmatched": 0}
    unbind(model)
    assert_bit_identical(base, module)


def diffusers_fused(make_transformer, path, dtype, strength):
    """Reference: diffusers' own conversion + peft fuse on a fresh copy of the same transformer."""
    from diffusers import WanPipeline

    reference = make_transformer(dtype)
    logger = logging.getLogger("diffusers")
    level = logger.level
    logger.setLevel(logging.ERROR)  # diffusers warns about fp32-kept modules and peft's false lora_bias warning
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            converted = WanPipeline.lora_state_dict(str(path.parent), weight_name=path.name)
            converted = converted[0] if isinstance(converted, tuple) else converted
            reference.load_lora_adapter(converted, prefix="transformer", adapter_name="reference")
            reference.fuse_lora(lora_scale=strength)
    finally:
        logger.setLevel(level)
    return {k.replace(".base_layer.", "."): v for k, v in reference.state_dict().items() if "lora_" not in k}


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_block_linears_match_diffusers_fuse(make_model, make_transformer, tmp_path, dtype):
    model = make_model(dtype)
    module = model.components["transformer"]
    base = snapshot(module)
    tensors, expected = lightx2v_lora(module, seed=2, full=False)
    path = tmp_path / "lightx2v_blocks.safetensors"
    save_file(tensors, str(path))
    bind(model, [FuseSpec(str(path), 0.7, "transformer")], [])
    ours = module.state_dict()
    theirs = diffusers_fused(make_transformer, path, dtype, 0.7)
    assert set(expected) <= set(theirs)
    for name in expected:
        diff = (ours[name].double() - theirs[name].double()).abs()
        if dtype == torch.float32:
            assert diff.max().item() <= 1e-6, name
        else:
            # diffusers loads A and B in bf16, rounds the delta to bf16, then the sum again; we round the exact
            # sum once. So the two agree within bf16 steps of the operands' magnitudes (|W|, and |B|·|A| for
            # the product of rounded factors).
            spec = expected[name]
            magnitude = base[name].double().abs()
            if spec[0] == "low_rank":
                _, up, down, scale = spec
                magnitude = magnitude + 0.7 * scale * (up.double().abs() @ down.double().abs())
            else:
                magnitude = magnitude + 0.7 * spec[1].double().abs()
            assert bool((diff <= 2 * magnitude * 2.0 ** -8).all()), name
        assert not torch.equal(ours[name], base[name])


def tiny_qwen_transformer():
    from diffusers import QwenImageTransformer2DModel

    torch.manual_seed(0)
    return QwenImageTransformer2DModel(
        patch_size=2, in_channels=16, out_channels=4, num_layers=2, attention_head_dim=16, num_attention_heads=3,
        joint_attention_dim=16, guidance_embeds=False, axes_dims_rope=(8, 4, 4)).eval()


QWEN_MODULES = ("transformer_blocks.{b}.attn.to_q", "transformer_blocks.{b}.attn.to_out.0",
                "transformer_blocks.{b}.attn.add_k_proj", "transformer_blocks.{b}.attn.to_add_out",
                "transformer_blocks.{b}.img_mod.1", "transformer_blocks.{b}.txt_mlp.net.0.proj",
                "transformer_blocks.{b}.img_mlp.net.2")


def test_kohya_qwen_file_matches_diffusers_fuse(tmp_path):
    """musubi/kohya ``lora_unet_`` names with per-pair alpha: diffusers' Qwen converter supports them, so both
    fuses must agree (diffusers splits alpha/rank between the factors; the product is the same)."""
    from diffusers import QwenImagePipeline

    from lorabind.loaders.models.store import LoadedModel

    g = torch.Generator().manual_seed(4)
    tensors, modules = {}, [m.format(b=b) for b in range(2) for m in QWEN_MODULES]
    ours = tiny_qwen_transformer()
    for path in modules:
        weight = ours.get_submodule(path).weight
        flat = "lora_unet_" + path.replace(".", "_")
        tensors[f"{flat}.lora_down.weight"] = torch.randn(4, weight.shape[1], generator=g) * 0.1
        tensors[f"{flat}.lora_up.weight"] = torch.randn(weight.shape[0], 4, generator=g) * 0.1
        tensors[f"{flat}.alpha"] = torch.tensor(2.0)
    path = tmp_path / "qwen_kohya.safetensors"
    save_file(tensors, str(path))
    base = snapshot(ours)
    model = LoadedModel(path="tiny-qwen", name="tiny-qwen", family="qwen_image", pipeline=None,
                        components={"transformer": ours})
    report = bind(model, [FuseSpec(str(path), 0.8, "transformer")], [])
    assert report.fuses[0]["accounting"]["counts"]["applied"] == len(tensors) and report.written == len(modules)

    reference = tiny_qwen_transformer()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        converted = QwenImagePipeline.lora_state_dict(str(path.parent), weight_name=path.name)
        converted = converted[0] if isinstance(converted, tuple) else converted
        reference.load_lora_adapter(converted, prefix="transformer", adapter_name="reference")
        reference.fuse_lora(lora_scale=0.8)
    theirs = {k.replace(".base_layer.", "."): v for k, v in reference.state_dict().items() if "lora_" not in k}
    state = ours.state_dict()
    for module in modules:
        name = f"{module}.weight"
        assert not torch.equal(state[name], base[name])
        assert (state[name] - theirs[name]).abs().max().item() <= 1e-6, name
    assert all(torch.equal(state[k], base[k]) for k in base if k[: -len(".weight")] not in modules)
