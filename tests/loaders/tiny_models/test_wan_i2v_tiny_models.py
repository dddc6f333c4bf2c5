"""The built-in image-to-video tiny models, their fixture LoRAs and the example input images."""

import json

import pytest
from safetensors import safe_open

I2V_MODELS = ("tiny-wan22-i2v", "tiny-wan21-i2v", "tiny-wan22-ti2v")


def _index(root, name):
    return json.loads((root / "diffusers" / name / "model_index.json").read_text())


def _config(root, name, component):
    return json.loads((root / "diffusers" / name / component / "config.json").read_text())


def test_wan22_i2v_is_two_36_channel_experts_without_an_image_encoder(tiny_models_root):
    index = _index(tiny_models_root, "tiny-wan22-i2v")
    assert index["_class_name"] == "WanImageToVideoPipeline"
    assert index["boundary_ratio"] == 0.9
    assert index["image_encoder"] == [None, None] and index["image_processor"] == [None, None]
    for component in ("transformer", "transformer_2"):
        config = _config(tiny_models_root, "tiny-wan22-i2v", component)
        assert (config["in_channels"], config["out_channels"], config["image_dim"]) == (36, 16, None)


def test_wan21_i2v_has_a_clip_image_branch(tiny_models_root):
    index = _index(tiny_models_root, "tiny-wan21-i2v")
    assert index["transformer_2"] == [None, None] and index["boundary_ratio"] is None
    assert index["image_encoder"] == ["transformers", "CLIPVisionModel"]
    assert index["image_processor"][1].startswith("CLIPImageProcessor")
    config = _config(tiny_models_root, "tiny-wan21-i2v", "transformer")
    encoder = _config(tiny_models_root, "tiny-wan21-i2v", "image_encoder")
    assert config["in_channels"] == 36 and config["image_dim"] == encoder["hidden_size"]
    folder = tiny_models_root / "diffusers" / "tiny-wan21-i2v" / "transformer"
    with safe_open(str(folder / "diffusion_pytorch_model.safetensors"), framework="pt") as handle:
        keys = set(handle.keys())
    assert {"blocks.0.attn2.add_k_proj.weight", "blocks.0.attn2.add_v_proj.weight",
            "blocks.0.attn2.norm_added_k.weight", "condition_embedder.image_embedder.ff.net.0.proj.weight"} <= keys


def test_ti2v_uses_the_48_channel_wan22_vae_and_expand_timesteps(tiny_models_root):
    index = _index(tiny_models_root, "tiny-wan22-ti2v")
    assert index["_class_name"] == "WanPipeline" and index["expand_timesteps"] is True
    vae = _config(tiny_models_root, "tiny-wan22-ti2v", "vae")
    assert (vae["z_dim"], vae["is_residual"], vae["patch_size"], vae["scale_factor_spatial"]) == (48, True, 2, 16)
    assert len(vae["latents_mean"]) == len(vae["latents_std"]) == 48
    config = _config(tiny_models_root, "tiny-wan22-ti2v", "transformer")
    assert (config["in_channels"], config["out_channels"]) == (48, 48)


@pytest.mark.parametrize("name", I2V_MODELS)
def test_diffusers_image_to_video_pipeline_loads_each_folder_offline(tiny_models_root, name):
    from diffusers import WanImageToVideoPipeline

    pipe = WanImageToVideoPipeline.from_pretrained(str(tiny_models_root / "diffusers" / name), local_files_only=True)
    assert pipe.config.expand_timesteps is (name == "tiny-wan22-ti2v")
    assert (pipe.image_encoder is not None) is (name == "tiny-wan21-i2v")
    assert (pipe.transformer_2 is not None) is (name == "tiny-wan22-i2v")


def _keys(path):
    with safe_open(str(path), framework="pt") as handle:
        return set(handle.keys())


def test_i2v_distill_fixtures_carry_the_published_names_and_the_image_branch(tiny_models_root):
    from lorabind.tiny_models import lora_fixtures as fx

    loras = tiny_models_root / "loras"
    assert fx.WAN22_I2V_HIGH == "lorabind-tiny/wan2.2_i2v_A14b_high_noise_lora_rank64_lightx2v_4step_1022.safetensors"
    assert fx.WAN22_I2V_LOW == "lorabind-tiny/wan2.2_i2v_A14b_low_noise_lora_rank64_lightx2v_4step_1022.safetensors"
    high, low = _keys(loras / fx.WAN22_I2V_HIGH), _keys(loras / fx.WAN22_I2V_LOW)
    assert high == low
    assert {"diffusion_model.blocks.0.cross_attn.k_img.lora_down.weight",
            "diffusion_model.blocks.1.cross_attn.norm_k_img.diff",
            "diffusion_model.img_emb.proj.1.lora_up.weight"} <= high
    assert (loras / fx.WAN22_I2V_HIGH).read_bytes() != (loras / fx.WAN22_I2V_LOW).read_bytes()
    assert "diffusion_model.blocks.0.cross_attn.v_img.lora_up.weight" in _keys(loras / fx.WAN21_I2V_DISTILL)


def test_input_images_are_deterministic_and_written_only_when_named(tmp_path):
    from PIL import Image

    from lorabind.tiny_models.input_images import END_IMAGE, START_IMAGE, ensure_input_images

    assert ensure_input_images({"a cat"}, tmp_path) == []
    assert not (tmp_path / "lorabind-tiny").exists()
    assert ensure_input_images({START_IMAGE, "x"}, tmp_path) == [START_IMAGE]
    first = {name: (tmp_path / name).read_bytes() for name in (START_IMAGE, END_IMAGE)}
    other = tmp_path / "again"
    assert ensure_input_images({START_IMAGE, END_IMAGE}, other) == [START_IMAGE, END_IMAGE]
    assert {name: (other / name).read_bytes() for name in first} == first
    assert ensure_input_images({START_IMAGE}, tmp_path) == []  # present: not rewritten
    start, end = (Image.open(tmp_path / name) for name in (START_IMAGE, END_IMAGE))
    assert start.mode == "RGB" and start.size == (64, 64)
    assert start.tobytes() != end.tobytes()
