"""LoraBindSampler's live previews (issue 56): headless, the runtime's settings for the prompt (one JPEG per step,
after its progress, the last one the result's first frame); inside ComfyUI, ComfyUI's own previewer on the latent
format our family names, its result handed to ComfyUI's ProgressBar; no preview method, nothing computed."""

from __future__ import annotations

import io
import logging
import sys
import types

import numpy as np
import pytest
import torch
from PIL import Image, ImageOps

from comfyui_stubs import install_comfyui_modules
from lorabind.loaders.generation.latent_preview import latent_to_rgb
from lorabind.loaders.generation.latent_rgb import LatentRGB
from lorabind.nodes import comfy_bridge
from lorabind.nodes.sampler_nodes import LoraBindSampler
from lorabind.runtime.context import ExecutionContext, reset_current_context, set_current_context
from lorabind.runtime.preview_options import PreviewOptions
from lorabind.usecases import previews as headless_previews

STEPS = 3
PREVIEW_SIZE = 64


def _sample(inputs, name: str):
    handle, positive, negative, latent = inputs[name]
    return LoraBindSampler().sample(handle, positive, negative, latent, 5, STEPS, 1.0, 5.0, 0.0, True)


def _headless(inputs, name: str, previews):
    """(the sampler's result, [("progress"|"preview", value, max, image)] in the order they were reported)."""
    events = []
    context = ExecutionContext("p", "6", previews=previews,
                               on_progress=lambda node, value, total, extra: events.append(("progress", value, total)),
                               on_preview=lambda node, value, total, image: events.append(("preview", value, total,
                                                                                           image)))
    token = set_current_context(context)
    try:
        return _sample(inputs, name), events
    finally:
        reset_current_context(token)


@pytest.mark.parametrize("name", ["tiny-wan22-t2v", "tiny-qwen-image"])
def test_headless_each_step_is_previewed_after_its_progress(tiny_sampler_inputs, name):
    result, events = _headless(tiny_sampler_inputs, name, PreviewOptions("auto", PREVIEW_SIZE, interval_ms=0))
    assert [event[:3] for event in events] == [(kind, step, STEPS) for step in (1, 2, 3)
                                               for kind in ("progress", "preview")]
    latent = tiny_sampler_inputs[name][3]
    frames = [np.asarray(Image.open(io.BytesIO(event[3]))) for event in events if event[0] == "preview"]
    assert all(frame.shape == (PREVIEW_SIZE, PREVIEW_SIZE, 3) for frame in frames)  # a square latent, fitted
    # the last step ends at sigma 0: its preview is the result's first frame through the family's map, fitted
    final = latent_to_rgb(result["result"][0].samples, headless_previews.preview_map(tiny_sampler_inputs[name][0],
                                                                                    latent))
    final = np.asarray(ImageOps.contain(Image.fromarray(final), (PREVIEW_SIZE, PREVIEW_SIZE),
                                        Image.Resampling.BILINEAR))
    assert np.abs(frames[-1].astype(int) - final.astype(int)).mean() < 6  # JPEG at quality 95 (measured: 3)


def test_headless_without_a_preview_method_nothing_is_computed(tiny_sampler_inputs, monkeypatch):
    monkeypatch.setattr(headless_previews, "latent_to_rgb", lambda *a: pytest.fail("a preview was computed"))
    _, events = _headless(tiny_sampler_inputs, "tiny-wan22-t2v", None)
    assert [event[0] for event in events] == ["progress"] * STEPS


def test_previews_are_at_most_one_per_interval_and_the_last_step_always_goes_out():
    times = iter([0.0, 0.05, 0.2, 0.22, 0.23])
    previewer = headless_previews.StepPreviewer(LatentRGB(factors=((1.0, 1.0, 1.0),)), 512, 0.1, lambda: next(times))
    sent = [previewer(step, 5, torch.zeros(1, 1, 2, 2)) is not None for step in range(1, 6)]
    assert sent == [True, False, True, False, True]


def test_a_preview_is_fitted_into_the_preview_size_either_way_as_comfyui_fits_them():
    previewer = headless_previews.StepPreviewer(LatentRGB(factors=((1.0, 0.0, 0.0),)), 16, 0.0)
    image = Image.open(io.BytesIO(previewer(1, 1, torch.zeros(1, 1, 40, 80))))
    assert image.format == "JPEG" and image.size == (16, 8)
    assert Image.open(io.BytesIO(previewer(1, 1, torch.zeros(1, 1, 2, 4)))).size == (16, 8)


def test_headless_taesd_previews_with_latent2rgb_and_says_so_once(tiny_sampler_inputs, monkeypatch, caplog):
    monkeypatch.setattr(headless_previews, "_warned_taesd", False)
    handle, _, _, latent = tiny_sampler_inputs["tiny-wan22-t2v"]
    with caplog.at_level(logging.WARNING, logger="lorabind.previews"):
        first = headless_previews.step_previewer(handle, latent, "taesd", 512, 0.0)
        headless_previews.step_previewer(handle, latent, "taesd", 512, 0.0)
    assert isinstance(first, headless_previews.StepPreviewer) and first.rgb.comfy_format == "Wan21"
    assert [r.getMessage() for r in caplog.records].count(caplog.records[0].getMessage()) == 1
    assert "latent2rgb" in caplog.records[0].getMessage()
    assert headless_previews.step_previewer(handle, latent, "none", 512, 0.0) is None


@pytest.fixture
def comfyui_previewer(monkeypatch, tmp_path):
    """ComfyUI's ProgressBar, ``latent_preview`` and ``comfy.latent_formats`` stood in: ``get_previewer`` records
    the latent format it is given and previews as ComfyUI's do (a ("JPEG", image, size) tuple); ``method`` None
    stands for ``--preview-method none`` (ComfyUI then has no previewer)."""
    seen = {"method": "latent2rgb", "formats": [], "updates": []}

    class ProgressBar:
        def __init__(self, total):
            pass

        def update_absolute(self, value, total=None, preview=None):
            seen["updates"].append((value, total, preview))

    class LatentFormat:
        latent_channels, latent_rgb_factors, latent_rgb_factors_bias = 4, None, None

    class Wan21(LatentFormat):
        latent_channels = 16

    class Previewer:
        def decode_latent_to_preview_image(self, preview_format, x0):
            return (preview_format, tuple(x0.shape), 512)

    def get_previewer(device, latent_format):
        seen["formats"].append(latent_format)
        return Previewer() if seen["method"] else None

    install_comfyui_modules(monkeypatch, types.SimpleNamespace(), utils=types.SimpleNamespace(ProgressBar=ProgressBar),
                            model_management=types.SimpleNamespace(get_torch_device=lambda: "cpu",
                                                                   throw_exception_if_processing_interrupted=lambda: 0))
    monkeypatch.setitem(sys.modules, "latent_preview", types.SimpleNamespace(get_previewer=get_previewer))
    formats = types.SimpleNamespace(LatentFormat=LatentFormat, Wan21=Wan21)
    monkeypatch.setitem(sys.modules, "comfy.latent_formats", formats)
    yield seen
    comfy_bridge._comfy_modules.cache_clear()


def test_inside_comfyui_its_previewer_gets_the_comfyui_format_of_the_family(tiny_sampler_inputs, comfyui_previewer):
    _sample(tiny_sampler_inputs, "tiny-wan22-t2v")
    (latent_format,) = comfyui_previewer["formats"]
    assert type(latent_format).__name__ == "Wan21"  # ComfyUI's own class: its factors and TAESD decoder name
    shape = tuple(tiny_sampler_inputs["tiny-wan22-t2v"][3].samples.shape)
    assert comfyui_previewer["updates"] == [(step, STEPS, ("JPEG", shape, 512)) for step in (1, 2, 3)]


def test_inside_comfyui_a_latent_without_a_comfyui_format_carries_our_map(tiny_sampler_inputs, comfyui_previewer):
    _sample(tiny_sampler_inputs, "tiny-qwen-image")  # 4 latent channels: no VAE ComfyUI knows
    (latent_format,) = comfyui_previewer["formats"]
    assert type(latent_format).__name__ == "LatentFormat" and latent_format.latent_channels == 4
    assert latent_format.latent_rgb_factors == [[0.5, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0], [0.5, 0.0, 0.0]]
    assert [update[2] is not None for update in comfyui_previewer["updates"]] == [True] * STEPS


def test_inside_comfyui_without_a_preview_method_the_sampler_computes_nothing(tiny_sampler_inputs, comfyui_previewer,
                                                                               monkeypatch):
    comfyui_previewer["method"] = None
    from lorabind.loaders.generation import sampling

    monkeypatch.setattr(sampling, "denoised", lambda *a: pytest.fail("an estimate was computed for no preview"))
    _sample(tiny_sampler_inputs, "tiny-wan22-t2v")
    assert [update[2] for update in comfyui_previewer["updates"]] == [None] * STEPS
