"""Detection names family, size, variant and expert of each tiny file; mismatched and swapped sets are refused
naming both files."""

import dataclasses

import pytest
from safetensors.torch import save_file

from lorabind.loaders.errors import ModelLoadError
from lorabind.loaders.models.single_file.detect import check_set, detect
from lorabind.tiny_models.single_files import tiny_file_names

EXPECTED = {
    "wan2.2_t2v_high_noise_tiny": ("denoiser", "wan", "Wan2.2 T2V tiny high-noise expert", "t2v", "high"),
    "wan2.2_t2v_low_noise_tiny": ("denoiser", "wan", "Wan2.2 T2V tiny low-noise expert", "t2v", "low"),
    "wan2.1_t2v_tiny": ("denoiser", "wan", "Wan2.1 T2V tiny", "t2v", None),
    "wan2.2_i2v_high_noise_tiny": ("denoiser", "wan", "Wan2.2 I2V tiny high-noise expert", "i2v", "high"),
    "wan2.2_i2v_low_noise_tiny": ("denoiser", "wan", "Wan2.2 I2V tiny low-noise expert", "i2v", "low"),
    "wan2.1_i2v_tiny": ("denoiser", "wan", "Wan2.1 I2V tiny", "i2v", None),
    "wan2.2_ti2v_tiny": ("denoiser", "wan", "Wan2.2 TI2V tiny", "ti2v", None),
    "wan2.1_vace_tiny": ("denoiser", "wan", "Wan2.1 VACE tiny", "vace", None),
    "wan2.2_fun_vace_high_noise_tiny": ("denoiser", "wan", "Wan2.2 VACE tiny high-noise expert", "vace", "high"),
    "wan2.2_fun_vace_low_noise_tiny": ("denoiser", "wan", "Wan2.2 VACE tiny low-noise expert", "vace", "low"),
    "wan2.2_vae_tiny": ("vae", "wan", "Wan2.2 VAE (lorabind tiny)", None, None),
    "clip_vision_tiny": ("image_encoder", "wan", "CLIP vision (lorabind tiny)", None, None),
    "qwen_image_tiny": ("denoiser", "qwen_image", "Qwen-Image (lorabind tiny)", None, None),
    "wan_2.1_vae_tiny": ("vae", "wan", "Wan VAE (lorabind tiny)", None, None),
    "qwen_image_vae_tiny": ("vae", "qwen_image", "Qwen-Image VAE (lorabind tiny)", None, None),
    "umt5_tiny": ("text_encoder", "wan", "umt5 (lorabind tiny)", None, None),
    "qwen_2.5_vl_tiny": ("text_encoder", "qwen_image", "Qwen2.5-VL (lorabind tiny)", None, None),
}


@pytest.fixture
def root(single_file_root):
    return single_file_root


def _stem(name):
    base = name.split("/")[-1].removesuffix(".safetensors").removesuffix(".gguf")
    for suffix in ("_fp8_e4m3fn_scaled", "_fp8_e4m3fn", "_fp8_scaled", "_bf16", "_Q8_0", "_Q4_0"):
        base = base.removesuffix(suffix)
    return base


def _detect(root, kind, name):
    return detect(str(root / kind / name), name)


def test_every_tiny_file_is_detected_with_family_size_variant_and_precision(root):
    seen = set()
    for kind, names in tiny_file_names().items():
        for name in names:
            found = _detect(root, kind, name)
            role, family, title, variant, expert = EXPECTED[_stem(name)]
            assert (found.role, found.family, found.title, found.model.variant, found.expert) == \
                (role, family, title, variant, expert), name
            assert found.model.size == "tiny"
            precision = next((p for p in ("fp8_e4m3fn_scaled", "fp8_scaled", "fp8_e4m3fn", "bf16", "Q8_0", "Q4_0")
                              if p in name), "bf16").replace("Q", "q")  # GGUF: the file's quantization
            assert found.precision == {"fp8_e4m3fn_scaled": "fp8_scaled"}.get(precision, precision)
            assert found.describe().startswith(f"{name}: {title}")
            seen.add(_stem(name))
    assert seen == set(EXPECTED)


def _set(root, denoisers, vae, encoder):
    return check_set([_detect(root, "diffusion_models", f"lorabind-tiny/{d}_bf16.safetensors") for d in denoisers],
                     _detect(root, "vae", f"lorabind-tiny/{vae}.safetensors"),
                     _detect(root, "text_encoders", f"lorabind-tiny/{encoder}.safetensors"))


def test_a_fitting_set_is_accepted(root):
    files = _set(root, ["wan2.2_t2v_high_noise_tiny", "wan2.2_t2v_low_noise_tiny"], "wan_2.1_vae_tiny",
                 "umt5_tiny_bf16")
    assert files.family == "wan" and [d.expert for d in files.denoisers] == ["high", "low"]


@pytest.mark.parametrize("denoisers, vae, encoder, first, second, why", [
    (["wan2.2_t2v_low_noise_tiny", "wan2.2_t2v_high_noise_tiny"], "wan_2.1_vae_tiny", "umt5_tiny_bf16",
     "low_noise", "high_noise", "given swapped"),
    (["wan2.2_t2v_high_noise_tiny", "wan2.2_t2v_high_noise_tiny"], "wan_2.1_vae_tiny", "umt5_tiny_bf16",
     "high_noise", "high_noise", "both are high-noise experts"),
    (["wan2.1_t2v_tiny"], "qwen_image_vae_tiny", "umt5_tiny_bf16", "wan2.1_t2v_tiny", "qwen_image_vae_tiny",
     "a qwen_image_vae (Qwen-Image VAE (lorabind tiny)) does not go with a wan_transformer"),
    (["qwen_image_tiny"], "qwen_image_vae_tiny", "umt5_tiny_bf16", "qwen_image_tiny", "umt5_tiny_bf16",
     "takes qwen_image_vae and qwen25_vl"),
    (["wan2.2_t2v_high_noise_tiny", "qwen_image_tiny"], "wan_2.1_vae_tiny", "umt5_tiny_bf16",
     "wan2.2_t2v_high_noise", "qwen_image_tiny", "only Wan2.2 A14B has two experts"),
    (["wan2.2_ti2v_tiny"], "wan_2.1_vae_tiny", "umt5_tiny_bf16", "wan2.2_ti2v_tiny", "wan_2.1_vae_tiny",
     "the VAE has 16 latent channels, the denoiser 48"),
    (["wan2.1_t2v_tiny"], "wan2.2_vae_tiny", "umt5_tiny_bf16", "wan2.1_t2v_tiny", "wan2.2_vae_tiny",
     "the VAE has 48 latent channels, the denoiser 16"),
])
def test_sets_that_do_not_fit_are_refused_naming_both_files(root, denoisers, vae, encoder, first, second, why):
    with pytest.raises(ModelLoadError) as error:
        _set(root, denoisers, vae, encoder)
    message = str(error.value)
    assert first in message and second in message and why in message


def _shrunk_copy(root, tmp_path, name):
    """A tiny Wan expert with one block less: a size no configuration has."""
    from safetensors import safe_open

    with safe_open(str(root / "diffusion_models" / "lorabind-tiny" / name), "pt") as handle:
        tensors = {k: handle.get_tensor(k) for k in handle.keys()}
    tensors = {k: v for k, v in tensors.items() if not k.startswith("blocks.1.")}
    path = tmp_path / name
    save_file(tensors, str(path))
    return path


def test_unknown_shapes_are_refused_naming_the_file_and_the_known_configurations(root, tmp_path):
    path = _shrunk_copy(root, tmp_path, "wan2.2_t2v_low_noise_tiny_bf16.safetensors")
    with pytest.raises(ModelLoadError, match=r"wan2.2_t2v_low_noise_tiny_bf16.safetensors: a wan_transformer file "
                                             r"whose shapes .* match no known configuration .*Wan2.1 T2V 1.3B"):
        detect(str(path), path.name)


def test_a_pickle_checkpoint_is_refused_by_name(tmp_path):
    path = tmp_path / "wan2.1_t2v_1.3B_bf16.pt"
    path.write_bytes(b"not read")
    with pytest.raises(ModelLoadError, match=r"wan2.1_t2v_1.3B_bf16.pt: only .safetensors"):
        detect(str(path), path.name)


@pytest.mark.parametrize("other", ["wan2.2_i2v_A14B", "wan2.1_t2v_1.3B"], ids=["i2v_with_t2v", "1.3B_with_14B"])
def test_experts_of_different_models_are_refused_naming_both(root, other):
    """The rule on two detected experts whose shapes named different models (real-size files are too big for a
    test; detection of the model from shapes is covered above)."""
    from lorabind.loaders.models.single_file import catalog

    high = _detect(root, "diffusion_models", "lorabind-tiny/wan2.2_t2v_high_noise_tiny_bf16.safetensors")
    low = _detect(root, "diffusion_models", "lorabind-tiny/wan2.2_t2v_low_noise_tiny_bf16.safetensors")
    low = dataclasses.replace(low, model=next(m for m in catalog.known_models() if m.config == other))
    vae = _detect(root, "vae", "lorabind-tiny/wan_2.1_vae_tiny.safetensors")
    encoder = _detect(root, "text_encoders", "lorabind-tiny/umt5_tiny_bf16.safetensors")
    with pytest.raises(ModelLoadError, match="the two experts must be the same model") as error:
        check_set([high, low], vae, encoder)
    assert "wan2.2_t2v_high_noise_tiny_bf16" in str(error.value) and "wan2.2_t2v_low_noise_tiny_bf16" in str(error.value)


def test_a_minimax_h3_single_file_is_refused_saying_to_use_its_diffusers_folder(tmp_path):
    """A MiniMax-H3 denoiser in the native names diffusers' converter reads (the tiny configuration's tensors,
    zero-filled: only the header is read)."""
    import torch
    from diffusers import MiniMaxH3Transformer3DModel

    from lorabind.loaders.families.minimax_h3.key_layouts import MINIMAX_H3_TRANSFORMER
    from lorabind.tiny_models.minimax_h3 import TRANSFORMER_CONFIG

    with torch.device("meta"):
        shapes = {k: v.shape for k, v in MiniMaxH3Transformer3DModel(**TRANSFORMER_CONFIG).state_dict().items()}
    native = MINIMAX_H3_TRANSFORMER.native_plan(shapes)
    tensors = {key: torch.zeros(shapes[parts[0]][0] * len(parts), *shapes[parts[0]][1:], dtype=torch.bfloat16)
               for key, parts in native.items()}
    path = tmp_path / "minimax_h3_t2va_bf16.safetensors"
    save_file(tensors, str(path))
    with pytest.raises(ModelLoadError) as error:
        detect(str(path), "minimax_h3_t2va_bf16.safetensors")
    text = str(error.value)
    assert text.startswith("minimax_h3_t2va_bf16.safetensors: a MiniMax-H3 denoiser single file, which lorabind "
                           "does not load. MiniMax-H3 runs from its diffusers folder only")
    assert "models/diffusers/" in text and "LoraBindModelLoader" in text


def test_an_unknown_vae_names_every_kind_its_keys_fit(root, tmp_path):
    """A Wan2.2 VAE's key names fit both Wan VAE kinds; with unknown shapes, both are named with their shapes
    (not only the first kind tried)."""
    import torch
    from safetensors import safe_open

    with safe_open(str(root / "vae" / "lorabind-tiny" / "wan2.2_vae_tiny.safetensors"), "pt") as handle:
        tensors = {k: handle.get_tensor(k) for k in handle.keys()}
    tensors["conv2.weight"] = torch.cat([tensors["conv2.weight"]] * 2)  # twice the latent channels
    path = tmp_path / "wan2.2_vae_odd.safetensors"
    save_file(tensors, str(path))
    with pytest.raises(ModelLoadError) as error:
        detect(str(path), path.name)
    text = str(error.value)
    assert text.startswith("wan2.2_vae_odd.safetensors: a wan_vae file whose shapes ")
    assert "; or a wan22_vae file whose shapes " in text and "(Wan2.2 VAE, Wan2.2 VAE (lorabind tiny))" in text
