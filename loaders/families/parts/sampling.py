"""``FamilySampling``: loading a family's pipeline and running it: text, latents, the denoise loop, decoding.

Hooks for later work, by design: ``load_pipeline`` takes a ``PipelineSource`` (a diffusers folder, or modules
built from single files), and every denoiser forward goes through ``forward`` (one place per family to wrap with
a swap/offload hook).
"""

from __future__ import annotations

from typing import Callable, Optional

from ...errors import ModelLoadError
from ...generation.batch_rules import NoBatching
from ...generation.forward_route import route_forward
from ...generation.latent_rgb import LatentRGB, spread_over_rgb
from .bound import FamilyPart
from .tensor_parallel import TensorParallelPlan


class FamilySampling(FamilyPart):
    """``model`` arguments are ``loaders.models.store.LoadedModel`` objects (``model.family`` is one of this
    family's ``model_families``)."""

    # the step count the family's reference pipeline runs when a caller gives none (diffusers' WanPipeline and
    # QwenImagePipeline: 50); ``Generator.generate`` uses it when nothing bound declares a step count
    reference_steps = 50

    def load_pipeline(self, source):
        """The pipeline object (``LoadedModel.pipeline``) for a ``PipelineSource``; raises on an unsupported source.
        A single-file source's pipeline reports its ``model_index`` as ``pipeline_index(pipeline)`` does."""
        raise NotImplementedError

    def forward(self, model, component: str, **inputs):
        """THE denoiser forward: every model prediction of the family calls its denoisers through here (straight
        into the module, or through the step engine that batches it with other requests')."""
        return route_forward(model, component, inputs)

    def batch_rule(self, model, component: str):
        """How ``component``'s forward inputs stack along the batch (``generation.batch_rules.BatchRule``), or
        ``NoBatching`` saying why its forwards cannot share a batch: the step engine then runs each alone."""
        return NoBatching(f"{self.family.id} declares no batch rule for its denoiser forwards")

    def encode_text(self, model, text: str):
        """One prompt through the model's own text encoder -> ConditioningHandle (CPU, float32, batch 1)."""
        raise NotImplementedError

    def encode_with_images(self, model, text: str, images: list):
        """One prompt read together with input IMAGEs (an image-editing model) -> ConditioningHandle carrying
        what its denoiser needs of the images; ValueError naming the input when the model takes none."""
        raise ValueError(f"model {model.name!r} ({model.family}) takes no input images with its prompt; encode the "
                         "prompt with LoraBindTextEncode")

    def image_rules(self, model, images: list) -> list:
        """Lines saying how the model resizes input images for ``encode_with_images`` (node output)."""
        return []

    def latent_shape(self, model, width: int, height: int, frames: int, batch: int) -> tuple:
        """The latent shape for an output size; ValueError/LoraBindError naming the bad field."""
        raise NotImplementedError

    def empty_latent(self, model, width: int, height: int, frames: int = 1, batch: int = 1):
        """A zero LatentHandle of the family's shape: the sampler's start point for text-to-X."""
        raise NotImplementedError

    def image_latent(self, model, start_image, end_image, width: int, height: int, frames: int, batch: int = 1):
        """The start LatentHandle of an image-to-video run from ComfyUI IMAGEs (``end_image`` may be None)."""
        raise ValueError(f"model {model.name!r} ({model.family}) does not generate video from a start image")

    def control_latent(self, model, control_video, control_masks, reference_images, width: int, height: int,
                       frames: int, strength: float, batch: int = 1):
        """The start LatentHandle of a controlled video run (Wan VACE) from a control video (IMAGE), its masks
        (MASK) and reference images (IMAGE), each may be None; ValueError naming the input it cannot take."""
        raise ValueError(f"model {model.name!r} ({model.family}) takes no control video")

    def implied_task(self, latent) -> Optional[str]:
        """The sampling task a latent implies (MiniMax-H3: anchored on a first frame -> ``fl2va``), else None."""
        return None

    def effective_boundary(self, model, schedule) -> Optional[float]:
        """The sigma where a two-expert model switches experts for ``schedule``; None when there is no switch."""
        return None

    def experts_per_step(self, model, schedule) -> Optional[list]:
        """The denoiser each step runs on, or None when the denoiser follows the task, not the sigmas."""
        return None

    def check_inputs(self, model, positive, negative, latent, schedule) -> None:
        """Refuse inputs that cannot be sampled together, naming the input; cheap and weight-free."""
        raise NotImplementedError

    def run_warnings(self, model) -> list:
        """Lines the sampler shows (ui text, report, CLI, WebSocket) when a run will go ahead but is very likely
        not what the user meant, e.g. one expert of a two-expert model run alone; none by default."""
        return []

    def denoise(self, model, positive, negative, latent, schedule, seed: int, *,
                on_step: Optional[Callable[[int, int], None]] = None, on_latent: Optional[Callable] = None,
                check_interrupt: Optional[Callable[[], None]] = None):
        """Sample ``latent`` over the resolved ``schedule`` exactly -> a new LatentHandle. ``on_latent(done, total,
        denoised)``, when given, sees each step's clean-latent estimate in the shape of ``latent.samples``."""
        raise NotImplementedError

    # The linear latent->RGB maps of the latent spaces of this family's VAEs (``generation.latent_preview``).
    latent_rgb_maps: tuple = ()

    def latent_rgb(self, channels: int) -> LatentRGB:
        """The map for a latent of ``channels`` channels: the family's own for that VAE, else an even spread (a
        tiny model's VAE, which nobody has fitted)."""
        return next((rgb for rgb in self.latent_rgb_maps if rgb.channels == channels), spread_over_rgb(channels))

    def decode(self, model, latent):
        """Latent -> ComfyUI IMAGE, float [frames, H, W, 3] in 0..1."""
        raise NotImplementedError

    def tensor_parallel_plan(self, denoiser):
        """How ``loaders.models.tensor_parallel`` splits one denoiser across ranks: a
        ``TensorParallelPlan``. By default the plan diffusers ships on the denoiser's class (``_tp_plan``); a
        denoiser without one is refused, naming the family and the reason."""
        linears = getattr(type(denoiser), "_tp_plan", None)
        if not linears:
            raise ModelLoadError(
                f"{self.family.id}: --parallel tp cannot split its denoiser {type(denoiser).__name__}: it has no "
                f"tensor-parallel plan (diffusers ships none for it and lorabind has none); use ulysses, ring or "
                f"cfg parallelism instead")
        return TensorParallelPlan(linears=dict(linears), heads=int(denoiser.config.num_attention_heads))
