"""``Generator``'s arguments as the guides type them (issue 59 item 4, issue 61 item 5): ``generate`` without
``steps`` runs the family's reference step count when nothing declares one, vllm-omni's
``num_weight_load_threads`` is taken, and values no sampler takes (NaN guidance or shift, a negative shift,
``steps=10**6``) are refused naming the argument before anything runs."""

from __future__ import annotations

import math

import pytest

from lorabind.loaders.contract_types import MAX_STEPS
from lorabind.tiny_models import lora_fixtures as F


@pytest.fixture(scope="module")
def qwen_files(tiny_models_root):
    """The guide's Qwen single-file snippet, on the tiny files: denoiser, VAE and text encoder."""
    from lorabind.tiny_models.single_files import write_tiny_single_files

    write_tiny_single_files(tiny_models_root)
    return tiny_models_root


@pytest.fixture(scope="module")
def qwen(qwen_files):
    from lorabind import Generator

    root = qwen_files
    return Generator.from_files(root / "diffusion_models" / "lorabind-tiny" / "qwen_image_tiny_bf16.safetensors",
                                vae=root / "vae" / "lorabind-tiny" / "qwen_image_vae_tiny.safetensors",
                                text_encoder=root / "text_encoders" / "lorabind-tiny" / "qwen_2.5_vl_tiny_bf16.safetensors",
                                tokenizer_dirs=[root / "diffusers" / "tiny-qwen-image" / "tokenizer"])


def test_generate_without_steps_asks_the_sampler_for_the_familys_reference_step_count(qwen, monkeypatch):
    from lorabind.usecases import generator as module

    asked = []

    def no_sampling(handle, positive, negative, latent, options, **kwargs):
        asked.append(options.steps)
        raise RuntimeError("stop before denoising")

    monkeypatch.setattr(module, "sample", no_sampling)
    with pytest.raises(RuntimeError, match="stop before denoising"):
        qwen.generate("a red fox", height=16, width=16)
    assert asked == [50]


@pytest.mark.slow
def test_generate_without_steps_runs_the_familys_reference_step_count(qwen):
    from lorabind.loaders.families import family_for

    result = qwen.generate("a red fox", height=16, width=16, seed=3)
    assert result.schedule["steps"] == family_for(qwen.handle).sampling.reference_steps == 50
    assert len(result.schedule["sigmas"]) == 51 and result.images[0].size == (16, 16)


def test_generate_without_steps_takes_what_a_bound_file_declares(qwen, qwen_files):
    lightning = qwen.bind_distill(qwen_files / "loras" / F.QWEN_LIGHTNING)
    assert lightning.generate("a red fox", height=32, width=32).schedule["steps"] == 4


@pytest.mark.parametrize("name, value, words", [
    ("guidance_scale", math.nan, "guidance_scale must be a finite number of at least 0, got nan"),
    ("flow_shift", math.nan, "flow_shift must be a finite number of at least 0.001, got nan"),
    ("flow_shift", -3.0, "flow_shift must be a finite number of at least 0.001, got -3.0"),
    ("flow_shift", 0.0, "flow_shift must be a finite number of at least 0.001, got 0.0"),
    ("steps", 10 ** 6, f"steps must be a whole number from 0 to {MAX_STEPS}, got 1000000"),
    ("steps", 4.5, f"steps must be a whole number from 0 to {MAX_STEPS}, got 4.5"),
    ("guidance_scale_low", math.inf, "guidance_scale_low must be a finite number of at least 0, got inf"),
    ("boundary_ratio", 1.5, "boundary_ratio must be a finite number from 0 to 1, got 1.5"),
])
def test_a_value_no_sampler_takes_is_refused_naming_the_argument(qwen, name, value, words, monkeypatch):
    from lorabind.usecases import generator as module

    def sampled(*args, **kwargs):  # a million steps would run for hours: fail at once instead
        raise AssertionError(f"{name}={value!r} reached the sampler")

    monkeypatch.setattr(module, "sample", sampled)
    with pytest.raises(ValueError) as caught:
        qwen.generate("a red fox", height=32, width=32, **{name: value})
    assert str(caught.value) == f"Generator.generate: {words}"


def test_num_weight_load_threads_is_the_load_workers_setting(tiny_models_root, monkeypatch):
    from lorabind import Generator
    from lorabind.usecases import generator as module

    seen = {}
    real = module.load_model

    def recording(folder, **options):
        seen.update(options)
        return real(folder, **options)

    monkeypatch.setattr(module, "load_model", recording)
    generator = Generator(tiny_models_root / "diffusers" / "tiny-wan21-t2v", num_weight_load_threads=8)
    assert seen["load_workers"] == 8 and generator.handle.model.name == "tiny-wan21-t2v"
    with pytest.raises(ValueError, match=r"num_weight_load_threads=8 and load_workers=2 contradict each other"):
        Generator(tiny_models_root / "diffusers" / "tiny-wan21-t2v", num_weight_load_threads=8, load_workers=2)
    with pytest.raises(ValueError, match=r"num_weight_load_threads must be a whole number of at least 1, got 0"):
        Generator(tiny_models_root / "diffusers" / "tiny-wan21-t2v", num_weight_load_threads=0)
