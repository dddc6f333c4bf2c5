"""The tiny single files are genuinely native: diffusers' own from_single_file gives back the tiny weights."""

import pytest
import torch
from safetensors import safe_open

from lorabind.tiny_models.single_files import SUBFOLDER


@pytest.fixture
def tiny_root(single_file_root):
    return single_file_root


@pytest.mark.parametrize("stem, folder, component, cls", [
    ("wan2.2_t2v_high_noise_tiny", "tiny-wan22-t2v", "transformer", "WanTransformer3DModel"),
    ("wan2.2_t2v_low_noise_tiny", "tiny-wan22-t2v", "transformer_2", "WanTransformer3DModel"),
    ("wan2.1_t2v_tiny", "tiny-wan21-t2v", "transformer", "WanTransformer3DModel"),
    ("qwen_image_tiny", "tiny-qwen-image", "transformer", "QwenImageTransformer2DModel"),
    ("wan2.2_i2v_high_noise_tiny", "tiny-wan22-i2v", "transformer", "WanTransformer3DModel"),
    ("wan2.1_i2v_tiny", "tiny-wan21-i2v", "transformer", "WanTransformer3DModel"),  # + the CLIP image branch
    ("wan2.2_ti2v_tiny", "tiny-wan22-ti2v", "transformer", "WanTransformer3DModel"),
])
def test_diffusers_from_single_file_reads_the_bf16_files_exactly(tiny_root, stem, folder, component, cls):
    import diffusers

    model_cls = getattr(diffusers, cls)
    path = tiny_root / "diffusion_models" / SUBFOLDER / f"{stem}_bf16.safetensors"
    from_file = model_cls.from_single_file(str(path), config=str(tiny_root / "diffusers" / folder),
                                           subfolder=component, local_files_only=True, torch_dtype=torch.bfloat16)
    reference = model_cls.from_pretrained(str(tiny_root / "diffusers" / folder), subfolder=component)
    expected, got = reference.state_dict(), from_file.state_dict()
    assert sorted(got) == sorted(expected)
    # from_single_file casts everything to the requested dtype (it does not keep Wan's fp32 modules in fp32)
    for key, tensor in expected.items():
        assert got[key].dtype == torch.bfloat16 and torch.equal(got[key], tensor.to(torch.bfloat16)), key


def test_the_wan22_vae_file_nests_its_stages_as_the_original_checkpoint_does(tiny_root):
    """diffusers reads the Wan2.2 VAE only through its conversion script (``convert_vae_22``: a stage's blocks are
    ``downsamples.{i}.downsamples.{j}``, resnets first, then the resampler), not ``from_single_file``; the tiny
    config has one resnet per encoder stage and two per decoder stage, and no resampler in the last stage."""
    with safe_open(str(tiny_root / "vae" / SUBFOLDER / "wan2.2_vae_tiny.safetensors"), "pt") as handle:
        keys = set(handle.keys())
    assert not any(part in key for key in keys for part in ("down_blocks", "up_blocks", "resnets", "mid_block"))
    for stage in range(4):
        assert f"encoder.downsamples.{stage}.downsamples.0.residual.2.weight" in keys
        assert f"decoder.upsamples.{stage}.upsamples.1.residual.6.weight" in keys
    assert "encoder.downsamples.1.downsamples.1.time_conv.weight" in keys  # temporal downsampling stages
    assert "encoder.downsamples.0.downsamples.1.resample.1.weight" in keys
    assert "decoder.upsamples.0.upsamples.2.time_conv.weight" in keys
    assert not any(k.startswith(("encoder.downsamples.3.downsamples.1", "decoder.upsamples.3.upsamples.2"))
                   for k in keys)
    assert {"conv1.weight", "conv2.weight", "encoder.head.2.weight", "decoder.middle.1.to_qkv.weight"} <= keys


def test_fp8_files_store_fp8_weights_and_scales(tiny_root):
    folder = tiny_root / "diffusion_models" / SUBFOLDER
    with safe_open(str(folder / "wan2.1_t2v_tiny_fp8_scaled.safetensors"), "pt") as scaled:
        assert scaled.get_slice("scaled_fp8").get_dtype() == "F8_E4M3"
        assert scaled.get_slice("blocks.0.self_attn.q.weight").get_dtype() == "F8_E4M3"
        assert scaled.get_slice("blocks.0.self_attn.q.bias").get_dtype() == "BF16"
        scale = scaled.get_tensor("blocks.0.self_attn.q.scale_weight")
        weight = scaled.get_tensor("blocks.0.self_attn.q.weight")
    # the scale maps the largest weight onto fp8's largest finite value, 448
    assert scale.dtype == torch.float32 and weight.float().abs().max().item() == pytest.approx(448.0, rel=0.07)
    with safe_open(str(folder / "wan2.1_t2v_tiny_fp8_e4m3fn.safetensors"), "pt") as plain:
        assert "scaled_fp8" not in plain.keys() and not any(k.endswith("scale_weight") for k in plain.keys())
        assert plain.get_slice("blocks.0.ffn.0.weight").get_dtype() == "F8_E4M3"


def test_umt5_file_carries_a_sentencepiece_model_with_the_folder_tokenizers_ids(tiny_root):
    import sentencepiece
    from transformers import AutoTokenizer

    from lorabind.loaders.families.wan.tokenizer import umt5_tokenizer_from_spiece

    with safe_open(str(tiny_root / "text_encoders" / SUBFOLDER / "umt5_tiny_bf16.safetensors"), "pt") as handle:
        spiece = handle.get_tensor("spiece_model")
    assert spiece.dtype == torch.uint8
    folder_tokenizer = AutoTokenizer.from_pretrained(str(tiny_root / "diffusers" / "tiny-wan22-t2v" / "tokenizer"))
    file_tokenizer = umt5_tokenizer_from_spiece(spiece.numpy().tobytes(), "umt5_tiny_bf16.safetensors")
    # ComfyUI reads the same bytes with sentencepiece itself (SPieceTokenizer, add_eos=True)
    comfy_like = sentencepiece.SentencePieceProcessor(model_proto=spiece.numpy().tobytes(), add_eos=True)
    for prompt in ("a cat dancing on the street", "Blurry, low quality video of 2 red cars!"):
        expected = folder_tokenizer(prompt)["input_ids"]
        assert file_tokenizer(prompt)["input_ids"] == expected
        assert comfy_like.encode(prompt) == expected


def test_a_missing_qwen_tokenizer_names_what_was_looked_for_and_where(tmp_path):
    from lorabind.loaders.errors import ModelLoadError
    from lorabind.loaders.families.qwen_image.tokenizer import qwen25_tokenizer

    empty = tmp_path / "tokenizers"
    empty.mkdir()
    with pytest.raises(ModelLoadError) as error:
        qwen25_tokenizer([empty, None], "qwen_2.5_vl_7b_fp8_scaled.safetensors")
    message = str(error.value)
    assert message.startswith("qwen_2.5_vl_7b_fp8_scaled.safetensors: a Qwen2.5-VL text encoder file carries no "
                              "tokenizer")
    assert "tokenizer.json or vocab.json + merges.txt" in message and str(empty) in message
    assert "comfy/text_encoders/qwen25_tokenizer" in message and "--tokenizer" in message


def test_a_qwen_tokenizer_with_more_ids_than_the_encoder_is_passed_over_for_one_that_fits(tiny_models_root):
    """An edit model's tokenizer (its vision tokens added) sits beside the text-to-image one: a text-to-image
    encoder gets the one that fits its embedding, and a set where none fits is refused naming the folder."""
    from lorabind.loaders.errors import ModelLoadError
    from lorabind.loaders.families.qwen_image.tokenizer import qwen25_tokenizer

    diffusers = tiny_models_root / "diffusers"
    edit, plain = diffusers / "tiny-qwen-image-edit" / "tokenizer", diffusers / "tiny-qwen-image" / "tokenizer"
    plain_size = len(qwen25_tokenizer([plain], "te.safetensors"))
    assert len(qwen25_tokenizer([edit], "te.safetensors")) > plain_size
    assert len(qwen25_tokenizer([edit, plain], "te.safetensors", plain_size)) == plain_size
    with pytest.raises(ModelLoadError) as error:
        qwen25_tokenizer([edit], "te.safetensors", plain_size)
    assert f"{edit} (" in str(error.value) and f"more than the encoder's {plain_size}" in str(error.value)
