"""Tiny transformers (random weights, built from configs, once per session) for the key-accounting tests."""

import pytest


def _tiny_wan(*, image_branch: bool):
    import torch
    from diffusers import WanTransformer3DModel

    torch.manual_seed(0)
    extra = {"image_dim": 20, "added_kv_proj_dim": 24} if image_branch else {}
    return WanTransformer3DModel(
        patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=12, in_channels=16, out_channels=16,
        text_dim=32, freq_dim=256, ffn_dim=32, num_layers=2, cross_attn_norm=True,
        qk_norm="rms_norm_across_heads", rope_max_seq_len=32, **extra).eval()


@pytest.fixture(scope="session")
def wan22_expert():
    """A Wan2.2 T2V expert: no image branch."""
    return _tiny_wan(image_branch=False)


@pytest.fixture(scope="session")
def wan21_i2v():
    """A Wan2.1 I2V transformer: CLIP image branch (add_k_proj/add_v_proj, image_embedder)."""
    return _tiny_wan(image_branch=True)


@pytest.fixture(scope="session")
def qwen_transformer():
    import torch
    from diffusers import QwenImageTransformer2DModel

    torch.manual_seed(0)
    return QwenImageTransformer2DModel(
        patch_size=2, in_channels=16, out_channels=4, num_layers=2, attention_head_dim=16, num_attention_heads=3,
        joint_attention_dim=16, guidance_embeds=False, axes_dims_rope=(8, 4, 4)).eval()


@pytest.fixture(autouse=True)
def _fresh_lora_cache():
    from lorabind.loaders.lora import clear_lora_cache

    clear_lora_cache()
    yield
    clear_lora_cache()
