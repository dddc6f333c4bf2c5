"""The Wan pipeline assembled from modules built out of ComfyUI's single files (``loaders.models.single_file``).

The result is the pipeline the equivalent diffusers folder loads as: ``WanPipeline`` for text-to-video (and
TI2V-5B, whose folder is a ``WanPipeline`` with ``expand_timesteps``), ``WanImageToVideoPipeline`` for the I2V
models (in_channels 36: the encoded image and its frame mask are concatenated to the noise), with Wan2.1 I2V's
CLIP vision encoder and its image processor, ``WanVACEPipeline`` for the VACE models (a transformer with
``vace_layers``: Wan2.1 VACE, and the Wan2.2 VACE Fun experts, whose boundary is T2V A14B's). Two experts get
the published ``boundary_ratio`` (0.9 I2V, 0.875 T2V), as the Wan-AI folders' ``model_index.json`` hold it; so
does one expert alone, as an A14B folder without ``transformer_2`` would: that is how the family tells it from
Wan2.1 and warns (``run_warnings``).
"""

from __future__ import annotations

import os
import re

from ...errors import ModelLoadError
from .image_conditioning import clip_image_processor
from .vace_conditioning import is_vace

_WAN21_NAME = re.compile(r"wan[-_ .]?2[._]?1(?![0-9])", re.IGNORECASE)


def _scheduler():
    # the scheduler the Wan-AI diffusers folders ship; lorabind's sampler drives its own sigmas
    from diffusers import UniPCMultistepScheduler

    return UniPCMultistepScheduler(prediction_type="flow_prediction", use_flow_sigmas=True, flow_shift=5.0,
                                   num_train_timesteps=1000)


def check_expert_files(denoisers: tuple) -> None:
    """Wan2.2 A14B's experts have exactly Wan2.1 14B's shapes, so the shapes cannot tell a Wan2.1 file from an
    expert; its name can (``detect`` reads the version from it, as ComfyUI's file names say it). A Wan2.1 file
    in an expert slot would run as that expert and give wrong videos without any error, so it is refused
    naming both files, as an I2V LoRA on a T2V model is."""
    if len(denoisers) != 2:
        return
    for slot, file in zip(("high-noise", "low-noise"), denoisers):
        if file.version == "2.1" or _WAN21_NAME.search(os.path.basename(file.name)):
            raise ModelLoadError(
                f"{denoisers[0].name} and {denoisers[1].name} do not fit together: {file.name} is a Wan2.1 file "
                f"({file.title}), given as the Wan2.2 {slot} expert. Wan2.2 A14B needs its two expert files "
                "(ComfyUI names them ..._high_noise_... and ..._low_noise_...); if this file is one, give it its "
                "expert's name")


def is_lone_expert(denoisers: tuple) -> bool:
    """One denoiser file that is one of Wan2.2 A14B's experts. Wan2.2's only one-transformer model is TI2V-5B,
    so a Wan2.2 T2V or I2V file (``detect`` reads the version from the name, or from I2V's shapes) is an expert
    whether or not its name says which."""
    return len(denoisers) == 1 and denoisers[0].version == "2.2" and denoisers[0].model.variant != "ti2v"


def assemble_wan_pipeline(source, *, i2v_boundary: float, t2v_boundary: float):
    """``PipelineSource(kind="single_file")`` -> the Wan pipeline (see the module docstring)."""
    from diffusers import WanImageToVideoPipeline, WanPipeline, WanVACEPipeline

    parts = dict(source.components)
    transformer = parts["transformer"].config
    image_to_video = transformer.in_channels > transformer.out_channels
    options = {"expand_timesteps": True} if source.variant == "ti2v" else {}
    if "transformer_2" in parts or is_lone_expert(source.denoiser_files):
        options["boundary_ratio"] = i2v_boundary if image_to_video else t2v_boundary
    common = dict(tokenizer=source.tokenizer, text_encoder=parts["text_encoder"], vae=parts["vae"],
                  scheduler=_scheduler(), transformer=parts["transformer"],
                  transformer_2=parts.get("transformer_2"), **options)
    if is_vace(transformer):
        return WanVACEPipeline(**common)
    if not image_to_video:
        return WanPipeline(**common)
    encoder = parts.get("image_encoder")
    processor = clip_image_processor(encoder.config.image_size) if encoder is not None else None
    return WanImageToVideoPipeline(image_encoder=encoder, image_processor=processor, **common)
