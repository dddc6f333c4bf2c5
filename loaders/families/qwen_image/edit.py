"""Qwen-Image-Edit (and Edit-Plus: 2509, 2511): input images -> what the prompt encoding and every forward see.

Follows diffusers' ``pipeline_qwenimage_edit.py`` / ``pipeline_qwenimage_edit_plus.py`` (0.42) step for step, so
our sampler's latents equal ``QwenImageEditPipeline`` / ``QwenImageEditPlusPipeline``'s on the same inputs:

- the images go *into the prompt*: Qwen2.5-VL reads them with the text (the pipeline's ``encode_prompt`` with its
  edit template, ``<|image_pad|>`` vision tokens, and the 64-token system prefix dropped);
- each image is also VAE-encoded (distribution mode, normalised with ``latents_mean``/``latents_std``), packed in
  2x2 patches and appended to the noise tokens at every forward; ``img_shapes`` lists the output grid then each
  image's, and only the output tokens of the prediction are kept.

The resizing rules differ (``RULES``): Edit resizes its one image to about 1024x1024 pixels of area (aspect kept,
sides multiples of 32) for both the vision encoder and the VAE; Edit-Plus takes several images, each resized to
about 384x384 of area for the vision encoder and 1024x1024 for the VAE. Both are stated in the node's output.

Why on the conditioning and not the latent: the images are part of the prompt encoding, and diffusers encodes
the negative prompt with the same images; a conditioning carries its own images, as ComfyUI's
``TextEncodeQwenImageEdit(Plus)`` reference latents do.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import torch

from ...handles import ConditioningHandle
from ...io import json_limits
from ...io.image_files import image_to_pil
from .prediction import EDIT_KEY as CONDITIONING_KEY
from .prediction import pack_qwen_latents

EDIT = "edit"
EDIT_PLUS = "edit_plus"
# {pipeline class in model_index.json: variant}
PIPELINE_VARIANTS = {"QwenImageEditPipeline": EDIT, "QwenImageEditPlusPipeline": EDIT_PLUS}
SIDE_MULTIPLE = 32  # calculate_dimensions rounds both sides to multiples of 32


@dataclass(frozen=True)
class ResizeRule:
    """How one variant resizes its input images (diffusers 0.42's pipelines)."""

    label: str
    max_images: int
    vision_area: int  # pixels of area the vision encoder sees (aspect ratio kept)
    vae_area: int  # pixels of area the VAE encodes
    output_from: int  # which image's aspect ratio the pipeline's default output size follows (0 first, -1 last)


# Edit: ``calculate_dimensions(1024 * 1024, ratio)`` for the one image, used for the prompt and the VAE alike.
# Edit-Plus: CONDITION_IMAGE_SIZE = 384 * 384 (prompt) and VAE_IMAGE_SIZE = 1024 * 1024 per image. ComfyUI's
# TextEncodeQwenImageEditPlus takes three images; so do we (each one costs a VAE encode at about 1 megapixel).
RULES = {
    EDIT: ResizeRule("Qwen-Image-Edit", 1, 1024 * 1024, 1024 * 1024, 0),
    EDIT_PLUS: ResizeRule("Qwen-Image-Edit-Plus (2509/2511)", 3, 384 * 384, 1024 * 1024, -1),
}


@dataclass(frozen=True, eq=False)
class EditReference:
    """The input images as the denoiser sees them, carried by the conditioning encoded with them."""

    variant: str
    latents: torch.Tensor  # [1, tokens, 4C] float32: every image's packed latent, in input order
    shapes: tuple  # ((1, h/2, w/2), ...) per image: its part of ``img_shapes``
    notes: tuple  # the resizing, one line per image (node output)

    def hidden_states(self, x: torch.Tensor) -> torch.Tensor:
        """The denoiser input: the noise tokens ``x`` [B, n, 4C] followed by the images' tokens."""
        return torch.cat([x, self.latents.to(x.device, x.dtype).expand(x.shape[0], -1, -1)], dim=1)


def pipeline_variant(model_index: dict):
    """EDIT, EDIT_PLUS, or None (text-to-image) for a Qwen-Image ``model_index.json``."""
    return PIPELINE_VARIANTS.get(str(model_index.get("_class_name", "")))


def needs_zero_cond_t(folder: Path) -> bool:
    """Whether a diffusers folder's transformer is Edit-2511's (``zero_cond_t``: its reference images at
    timestep 0), read from ``transformer/config.json``; False when the folder has none."""
    config = Path(folder) / "transformer" / "config.json"
    if not config.is_file():
        return False
    return bool(json_limits.load_file(config).get("zero_cond_t"))


def area_size(area: int, width: int, height: int) -> tuple:
    """diffusers' ``calculate_dimensions``: (width, height) of about ``area`` pixels at the image's aspect ratio,
    each side rounded to a multiple of 32."""
    ratio = width / height
    new_width = math.sqrt(area * ratio)
    new_height = new_width / ratio
    return round(new_width / SIDE_MULTIPLE) * SIDE_MULTIPLE, round(new_height / SIDE_MULTIPLE) * SIDE_MULTIPLE


def default_output_size(variant: str, images: list, multiple: int) -> tuple:
    """The output size the pipeline picks without ``width``/``height``: about 1024x1024 of area at the aspect
    ratio of the image ``output_from`` names, floored to ``multiple`` (VAE factor x 2)."""
    width, height = images[RULES[variant].output_from].size
    out_width, out_height = area_size(1024 * 1024, width, height)
    return out_width // multiple * multiple, out_height // multiple * multiple


def check_images(model_name: str, variant: str, images: list) -> None:
    rule = RULES[variant]
    if not images:
        raise ValueError(f"image_1: model {model_name!r} ({rule.label}) edits an input image; connect one")
    if len(images) > rule.max_images:
        extra = "; several images need Qwen-Image-Edit-2509 or 2511" if variant == EDIT else ""
        raise ValueError(f"image_{rule.max_images + 1}: model {model_name!r} ({rule.label}) takes at most "
                         f"{rule.max_images} input image(s){extra}")


def encode_edit_prompt(model, text: str, images: list, variant: str, device) -> ConditioningHandle:
    """The prompt read with the input ``images`` (ComfyUI IMAGEs) by the model's own pipeline, and the images'
    packed VAE latents: a ConditioningHandle carrying an ``EditReference``."""
    check_images(model.name, variant, images)
    pipeline, rule = model.pipeline, RULES[variant]
    pictures = [image_to_pil(image) for image in images]
    vision_images, latents, shapes, notes = [], [], [], []
    for index, picture in enumerate(pictures, start=1):
        vision_size = area_size(rule.vision_area, *picture.size)
        vae_size = area_size(rule.vae_area, *picture.size)
        vision_images.append(pipeline.image_processor.resize(picture, vision_size[1], vision_size[0]))
        # Edit encodes the very image its vision encoder saw (one size for both); Plus resizes the original again
        source = vision_images[-1] if variant == EDIT else picture
        pixels = pipeline.image_processor.preprocess(source, vae_size[1], vae_size[0]).unsqueeze(2)
        packed, shape = _packed_latent(pipeline.vae, pixels)
        latents.append(packed)
        shapes.append(shape)
        notes.append(f"image_{index} {picture.size[0]}x{picture.size[1]}: vision encoder {vision_size[0]}x"
                     f"{vision_size[1]}, VAE {vae_size[0]}x{vae_size[1]} ({rule.label}: about "
                     f"{_side(rule.vision_area)}² and {_side(rule.vae_area)}² of area, aspect kept, sides multiples "
                     f"of {SIDE_MULTIPLE})")
    prompt_images = vision_images if variant == EDIT_PLUS else vision_images[0]
    with torch.no_grad():
        embeds, mask = pipeline.encode_prompt(prompt=text, image=prompt_images, device=device)
    reference = EditReference(variant=variant, latents=torch.cat(latents, dim=1), shapes=tuple(shapes),
                              notes=tuple(notes))
    return ConditioningHandle(embeds=embeds.float().cpu(), family=model.family, text=text,
                              mask=mask.cpu() if mask is not None else None, extra={CONDITIONING_KEY: reference})


def _side(area: int) -> int:
    return int(math.isqrt(area))


def _packed_latent(vae, pixels: torch.Tensor) -> tuple:
    """VAE mode of ``pixels`` [1, 3, 1, H, W] (-1..1), normalised as the pipelines do, packed 2x2 -> ([1, n, 4C]
    float32, (1, h/2, w/2))."""
    param = next(vae.parameters())
    with torch.no_grad():
        latents = vae.encode(pixels.to(param.device, param.dtype)).latent_dist.mode().float()
    channels = vae.config.z_dim
    mean = torch.tensor(vae.config.latents_mean).view(1, channels, 1, 1, 1).to(latents.device, torch.float32)
    std = torch.tensor(vae.config.latents_std).view(1, channels, 1, 1, 1).to(latents.device, torch.float32)
    latents = ((latents - mean) / std).cpu()
    return pack_qwen_latents(latents), (1, latents.shape[-2] // 2, latents.shape[-1] // 2)


def check_conditioning(model_name: str, variant, positive, negative, uses_negative: bool) -> None:
    """An edit model needs prompts encoded with its input images (of its own variant: the templates differ); a
    text-to-image model refuses them. Names the input."""
    label = RULES[variant].label if variant else "Qwen-Image text-to-image"
    for input_name, handle in (("positive", positive), ("negative", negative if uses_negative else None)):
        if handle is None:
            continue
        reference = handle.extra.get(CONDITIONING_KEY)
        if variant and reference is None:
            raise ValueError(f"{input_name}: model {model_name!r} is {label}, which edits input images: encode the "
                             "prompt with LoraBindTextEncodeImageEdit and the image(s)")
        if reference is not None and reference.variant != variant:
            raise ValueError(f"{input_name}: it was encoded with input images for {RULES[reference.variant].label}, "
                             f"but model {model_name!r} is {label}; encode it with this model")
