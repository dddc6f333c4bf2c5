"""The native layouts are the exact inverse of diffusers' own single-file converters."""

import pytest
import torch

from lorabind.loaders.families.minimax_h3 import key_layouts as minimax_layouts
from lorabind.loaders.families.wan import key_layouts as layouts


def _to_native(layout, state_dict):
    plan = layout.native_plan(state_dict)
    return {native: layout.join(native, [state_dict[k] for k in parts]) for native, parts in plan.items()}


def _assert_same(converted, expected):
    assert sorted(converted) == sorted(expected)
    for key, tensor in expected.items():
        assert torch.equal(converted[key], tensor), key


def _wan_transformer(**overrides):
    from diffusers import WanTransformer3DModel

    config = dict(patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=8, in_channels=4, out_channels=4,
                  text_dim=8, freq_dim=16, ffn_dim=16, num_layers=2, cross_attn_norm=True,
                  qk_norm="rms_norm_across_heads", rope_max_seq_len=32)
    torch.manual_seed(0)
    return WanTransformer3DModel(**{**config, **overrides})


@pytest.mark.parametrize("variant", [{}, {"image_dim": 8, "added_kv_proj_dim": 16}], ids=["t2v", "i2v"])
def test_wan_transformer_layout_inverts_diffusers_converter(variant):
    from diffusers.loaders.single_file_utils import convert_wan_transformer_to_diffusers

    state_dict = _wan_transformer(**variant).state_dict()
    native = _to_native(layouts.WAN_TRANSFORMER, state_dict)
    assert "head.modulation" in native and "blocks.0.self_attn.q.weight" in native and "blocks.0.norm3.weight" in native
    if variant:
        assert "blocks.0.cross_attn.k_img.weight" in native and "img_emb.proj.1.weight" in native
    _assert_same(convert_wan_transformer_to_diffusers(dict(native)), state_dict)
    # and back: native names map to the diffusers ones key by key
    assert {layouts.WAN_TRANSFORMER.to_diffusers(k) for k in native} == set(state_dict)


def test_wan_vae_layout_inverts_diffusers_converter_on_the_real_structure():
    """diffusers' converter hard-codes the real models' 4 stages x 3 resnets; a narrow VAE with that structure."""
    from diffusers import AutoencoderKLWan
    from diffusers.loaders.single_file_utils import convert_wan_vae_to_diffusers

    torch.manual_seed(0)
    vae = AutoencoderKLWan(base_dim=2, z_dim=4, dim_mult=[1, 2, 4, 4], num_res_blocks=2,
                           temperal_downsample=[False, True, True])
    state_dict = vae.state_dict()
    layout = layouts.vae_layout_for(vae.config)
    native = _to_native(layout, state_dict)
    assert "decoder.upsamples.4.shortcut.weight" in native and "decoder.middle.1.to_qkv.weight" in native
    _assert_same(convert_wan_vae_to_diffusers(dict(native)), state_dict)


def test_minimax_h3_layout_inverts_diffusers_converter():
    from diffusers import MiniMaxH3Transformer3DModel
    from diffusers.loaders.single_file_utils import convert_minimax_h3_transformer_checkpoint_to_diffusers

    from lorabind.tiny_models.minimax_h3 import TRANSFORMER_CONFIG

    torch.manual_seed(0)
    model = MiniMaxH3Transformer3DModel(**TRANSFORMER_CONFIG)
    state_dict = model.state_dict()
    native = _to_native(minimax_layouts.MINIMAX_H3_TRANSFORMER, state_dict)
    assert any(k.endswith("attn.qkv_proj.weight") for k in native)
    converted = convert_minimax_h3_transformer_checkpoint_to_diffusers(dict(native), config=dict(model.config))
    _assert_same(converted, state_dict)
    for native_key, parts in minimax_layouts.MINIMAX_H3_TRANSFORMER.native_plan(state_dict).items():
        split = minimax_layouts.MINIMAX_H3_TRANSFORMER.split(native_key, native[native_key], parts)
        for key, tensor in split.items():
            assert torch.equal(tensor, state_dict[key]), key
