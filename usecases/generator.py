"""``from lorabind import Generator``: generation from a Python script, for people who script rather than draw.

Why a thin layer here: it asks the engine exactly what the nodes ask it, through the same use cases
(``usecases.verbs``): the model loaders, the fuse and adapter verbs (slot checks, key accounting, contracts), the
sampler's ``sample`` (every contract checked before a weight is bound) and the decoder. So a script gets the same
refusals, with the same error types (``LoraBindError``, ``ContractError``, ``ValueError`` for a bad option), as a
workflow, and no second engine exists to drift. It installs no host: it reads the files it is given by path, so
importing it inside ComfyUI changes nothing there.

Each ``bind_distill`` / ``add_adapter`` returns a new ``Generator`` on a new handle (like a node's output), so one
loaded model serves several differently bound generators; the sampler binds each one's LoRAs right before
denoising.

Calls from several threads at once go through one step engine (``loaders.batching``), the Python API's own: each
call's encode and decode take the device in turn, and their denoising steps run one forward at a time, batched up
to ``max_batch`` calls (``Generator(..., max_batch=N)``; 1 by default: one call's step at a time, each result
exactly what that call gives alone). Two threads never write the shared model's weights or run its VAE at once.
"""

from __future__ import annotations

import math
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import numpy as np
import torch
from PIL import Image

from ..loaders.batching.engine import StepEngine, used
from ..loaders.contract_types import MAX_STEPS, MIN_SHIFT
from ..loaders.families import family_for
from ..loaders.io.image_files import load_image_file
from .verbs import (
    attach_adapter,
    attach_fuse,
    attach_fuses,
    decode,
    empty_latent,
    encode_text,
    expert_slots,
    image_to_video_latent,
    load_checkpoint_files,
    load_model,
    sample,
)
from .vocabulary import SampleOptions, lora_components

# what the sampler node defaults to when nothing bound declares a value
DEFAULT_GUIDANCE = 5.0
DEFAULT_FLOW_SHIFT = 5.0
WHERE = "Generator"


@dataclass(frozen=True)
class Generation:
    """What ``generate`` returns: the decoded frames (one for an image model) and the schedule that ran (steps,
    sigmas, shift, cfg, the contracts enforced, what was bound), as the sampler node reports it."""

    frames: list
    schedule: dict = field(default_factory=dict)

    @property
    def images(self) -> list:
        return self.frames

    def save(self, path) -> Path:
        """One frame as that image; several as an animated WebP or GIF (by the file's suffix), 16 frames a
        second."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        first, *rest = self.frames
        if rest:
            first.save(path, save_all=True, append_images=rest, duration=1000 // 16, loop=0)
        else:
            first.save(path)
        return path


class Generator:
    """A loaded model, the LoRAs bound to it, and ``generate``. ``model``: a diffusers model folder;
    ``Generator.from_files`` takes ComfyUI's single files. ``load_options`` are the model loader's (``device``,
    ``dtype``, ``memory``, ``attention``, ``load_workers``); ``num_weight_load_threads`` is vllm-omni's name of
    ``load_workers`` (the weight files read at once)."""

    def __init__(self, model=None, *, max_batch: Optional[int] = None, num_weight_load_threads: Optional[int] = None,
                 _handle=None, _adapter=None, _declared=(), **load_options):
        if max_batch is not None:
            _calls_engine(max_batch)
        if num_weight_load_threads is not None:
            load_options["load_workers"] = _load_threads(num_weight_load_threads, load_options.get("load_workers"))
        if _handle is None:
            if model is None or not Path(model).is_dir():
                raise FileNotFoundError(f"{WHERE}: {model!r} is not a diffusers model folder (a folder with a "
                                        "model_index.json); for single files use Generator.from_files")
            _handle = load_model(Path(model), name=Path(model).name, **load_options)
        self.handle, self.adapter, self.declared = _handle, _adapter, tuple(_declared)

    @classmethod
    def from_files(cls, denoisers, *, vae, text_encoder, image_encoder=None, **load_options) -> "Generator":
        """ComfyUI's single files: one denoiser file, or a Wan2.2 pair high-noise first; the VAE, the text
        encoder and (Wan2.1 I2V) the image encoder files."""
        files = [denoisers] if isinstance(denoisers, (str, Path)) else list(denoisers)
        handle, _ = load_checkpoint_files([_named(f) for f in files], _named(vae), _named(text_encoder),
                                          _named(image_encoder) if image_encoder is not None else None,
                                          **load_options)
        return cls(_handle=handle)

    def bind_distill(self, *files, strength: float = 1.0) -> "Generator":
        """Fuse distill LoRA files (their contracts then hold every ``generate``): two on a two-expert model are
        the high-noise then the low-noise file (a swapped pair is refused); otherwise each goes where its family
        says. A new Generator; this one is unchanged."""
        paths = [str(f) for f in files]
        experts = expert_slots(self.handle)
        if len(paths) == 2 and experts is not None:
            slots = [(f"{which} file", os.path.basename(path), path, float(strength), component)
                     for which, path, component in zip(("first (high noise)", "second (low noise)"), paths, experts)]
            attached = attach_fuses(self.handle, slots, where=f"{WHERE}.bind_distill")
            return self._with(attached.handle, self.adapter, attached.contracts)
        generator = self
        for path in paths:
            attached = attach_fuse(generator.handle, os.path.basename(path), path, float(strength),
                                   where=f"{WHERE}.bind_distill")
            generator = generator._with(attached.handle, generator.adapter, attached.contracts)
        return generator

    def add_adapter(self, path, strength: float = 1.0, component: Optional[str] = None) -> "Generator":
        """A dynamic (PEFT) adapter at ``strength``, on ``component`` (default: the main denoiser, the high-noise
        expert of a two-expert model). Stacks on the adapters added before. A new Generator."""
        experts = expert_slots(self.handle)
        component = component or (experts[0] if experts else lora_components()[0])
        attached = attach_adapter(os.path.basename(str(path)), str(path), float(strength), component, self.adapter,
                                  where=f"{WHERE}.add_adapter")
        return self._with(self.handle, attached.handle, attached.contracts)

    def _with(self, handle, adapter, contracts) -> "Generator":
        return Generator(_handle=handle, _adapter=adapter, _declared=(*self.declared, *filter(None, contracts)))

    def generate(self, prompt: str, *, steps: Optional[int] = None, guidance_scale: Optional[float] = None,
                 flow_shift: Optional[float] = None, boundary_ratio: Optional[float] = None,
                 guidance_scale_low: Optional[float] = None, negative_prompt: str = "", height: int = 480,
                 width: int = 832, num_frames: int = 1, image=None, end_image=None, seed: int = 0,
                 scheduler: str = "euler", enforce_contract: bool = True) -> Generation:
        """Sample and decode. ``steps`` None: what the bound files declare, else the family's reference step count
        (50); 0: what they declare (refused when nothing does). ``guidance_scale`` / ``flow_shift`` None: what they
        declare, else 5 and 5 (the sampler node's defaults). ``image`` (a path, a PIL image or a ComfyUI IMAGE)
        makes it image-to-video. A request the contracts refuse raises ``ContractError`` naming the file and the
        field, before any weight changes; a value no sampler takes (NaN, a negative shift, 10**6 steps) raises
        ``ValueError`` naming the argument."""
        _check_numbers(steps=steps, guidance_scale=guidance_scale, guidance_scale_low=guidance_scale_low,
                       flow_shift=flow_shift, boundary_ratio=boundary_ratio)
        if steps is None:
            steps = 0 if self._declares_steps() else family_for(self.handle).sampling.reference_steps
        engine = _calls_engine()
        with used(engine), engine.device.held():  # encode/decode in turn; the denoise gives the turn up
            loaded = self.handle.model
            if image is not None:
                latent = image_to_video_latent(loaded, _image(image), None if end_image is None else _image(end_image),
                                               width=width, height=height, frames=num_frames)
            else:
                latent = empty_latent(loaded, width, height, num_frames)
            options = SampleOptions(
                seed=int(seed), steps=int(steps), cfg=self._declared_or("cfg", guidance_scale, DEFAULT_GUIDANCE),
                shift=self._declared_or("shift", flow_shift, DEFAULT_FLOW_SHIFT), boundary=boundary_ratio or 0.0,
                enforce_contract=enforce_contract, cfg_low_noise=guidance_scale_low or 0.0, scheduler=scheduler)
            samples, _, report = sample(self.handle, encode_text(loaded, prompt), encode_text(loaded, negative_prompt),
                                        latent, options, adapter=self.adapter)
            return Generation(_pil_frames(decode(loaded, samples)), report)

    def _declares_steps(self) -> bool:
        """Whether a bound file or the checkpoint declares a step count (what ``steps=0`` then takes)."""
        return any(c.get("steps") is not None for c in self.declared) or any(
            c.steps is not None or c.sigmas is not None for c in self.handle.contracts)

    def _declared_or(self, name: str, given: Optional[float], default: float) -> float:
        """``given``, else the first value a bound file declares for ``name``, else ``default``."""
        if given is not None:
            return float(given)
        return float(next((c[name] for c in self.declared if c.get(name) is not None), default))


# generate's numeric arguments -> (smallest, largest) value a sampler takes (None: unbounded); the steps bound is
# the sampler node's (MAX_STEPS: a 10**6-step request would only build a million-point schedule first)
_BOUNDS = {"steps": (0, MAX_STEPS), "guidance_scale": (0.0, None), "guidance_scale_low": (0.0, None),
           "flow_shift": (MIN_SHIFT, None), "boundary_ratio": (0.0, 1.0)}


def _check_numbers(**values) -> None:
    """Refuse, naming the argument, a value the sampler cannot take: not a number (NaN, infinite, a bool, a
    fractional step count) or outside ``_BOUNDS``. None is "not given"."""
    for name, value in values.items():
        if value is None:
            continue
        low, high = _BOUNDS[name]
        whole = name != "steps" or (isinstance(value, int) and not isinstance(value, bool))
        number = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
        if not (whole and number and value >= low and (high is None or value <= high)):
            span = f"from {low:g} to {high:g}" if high is not None else f"of at least {low:g}"
            kind = "a whole number" if name == "steps" else "a finite number"
            raise ValueError(f"{WHERE}.generate: {name} must be {kind} {span}, got {value!r}")


def _load_threads(threads, load_workers) -> int:
    """vllm-omni's ``num_weight_load_threads`` as our ``load_workers``; the two must agree when both are given."""
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise ValueError(f"{WHERE}: num_weight_load_threads must be a whole number of at least 1, got {threads!r}")
    if load_workers is not None and load_workers != threads:
        raise ValueError(f"{WHERE}: num_weight_load_threads={threads} and load_workers={load_workers} contradict "
                         "each other (they are the same setting)")
    return threads


_engine: Optional[StepEngine] = None
_engine_lock = threading.Lock()


def _calls_engine(max_batch: Optional[int] = None) -> StepEngine:
    """The Python API's step engine (made on first use: one call's forward at a time); ``max_batch`` resizes it
    for the calls that start afterwards."""
    global _engine
    with _engine_lock:
        if _engine is None:
            _engine = StepEngine(max_batch=max_batch or 1)
        elif max_batch is not None:
            _engine.resize(max_batch)
        return _engine


def _named(path) -> tuple:
    """``(path, name)`` as the single-file loader takes them: messages name the file by its name."""
    return str(path), os.path.basename(str(path))


def _image(value):
    """A ComfyUI IMAGE (float [1, H, W, 3] in 0..1) from a path (read as LoadImage reads it), a PIL image or an
    IMAGE as it is."""
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, (str, Path)):
        return load_image_file(value)[0][:1]
    pixels = np.asarray(value.convert("RGB"), dtype=np.float32) / 255.0
    return torch.from_numpy(pixels)[None]


def _pil_frames(images) -> list:
    pixels = (images.clamp(0, 1) * 255).round().to(torch.uint8).cpu().numpy()
    return [Image.fromarray(frame) for frame in pixels]
