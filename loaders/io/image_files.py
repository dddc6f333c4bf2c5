"""Image files <-> ComfyUI's IMAGE/MASK tensors, with ComfyUI's own conventions.

Why ComfyUI's conventions and not diffusers': the same API prompt must give the same tensors in ComfyUI (where
its core ``LoadImage`` reads the file) and headless (where ours does). ComfyUI's ``nodes.py::LoadImage``:
every frame of the file (an animated PNG/WebP/GIF gives a batch; frames of another size are skipped; an MPO
gives only its first frame), EXIF orientation applied, 16-bit ``I`` images scaled by 1/255, RGB as float32
``uint8 / 255`` in ``[B, H, W, 3]``, and the MASK from the alpha channel *inverted* (``1 - alpha``, so opaque
is 0) as ``[B, H, W]``, or a 64x64 zero mask per frame when there is no alpha.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import torch

# Formats whose extra "frames" are not a sequence (an MPO's second frame is a depth/stereo image).
_SINGLE_FRAME_FORMATS = ("MPO",)
_NO_ALPHA_MASK_SIZE = (64, 64)


def load_image_file(path) -> tuple[torch.Tensor, torch.Tensor]:
    """(IMAGE float [B, H, W, 3] in 0..1, MASK float [B, H', W']) of an image file, ComfyUI's way.

    Raises ``ValueError`` naming the file when it is not an image Pillow can read.
    """
    import numpy as np
    from PIL import Image, ImageOps, ImageSequence, UnidentifiedImageError

    try:
        picture = Image.open(path)
    except (UnidentifiedImageError, OSError) as exc:
        raise ValueError(f"{Path(path).name}: not a readable image file ({exc})") from None
    with picture:
        images, masks, size = [], [], None
        for frame in ImageSequence.Iterator(picture):
            frame = ImageOps.exif_transpose(frame)
            if frame.mode == "I":
                frame = frame.point(lambda value: value * (1 / 255))
            rgb = frame.convert("RGB")
            size = size or rgb.size
            if rgb.size != size:
                continue
            images.append(torch.from_numpy(np.array(rgb).astype(np.float32) / 255.0)[None])
            if "A" in frame.getbands():
                alpha = torch.from_numpy(np.array(frame.getchannel("A")).astype(np.float32) / 255.0)
                masks.append((1.0 - alpha)[None])
            else:
                masks.append(torch.zeros((1, *_NO_ALPHA_MASK_SIZE), dtype=torch.float32))
            if picture.format in _SINGLE_FRAME_FORMATS:
                break
    return torch.cat(images), torch.cat(masks)


def file_sha256(path) -> str:
    """Hex SHA-256 of a file's bytes (``LoadImage.IS_CHANGED``: a replaced file with the same name re-runs)."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def image_to_pil(image: torch.Tensor):
    """First frame of a ComfyUI IMAGE ([B, H, W, 3] float 0..1) as an 8-bit PIL image: what diffusers' pipelines
    are given (their resize, normalisation and vision-encoder preprocessing all start from PIL)."""
    import numpy as np
    from PIL import Image

    frame = image[0] if image.dim() == 4 else image
    array = np.clip(frame[..., :3].float().cpu().numpy() * 255.0 + 0.5, 0, 255).astype(np.uint8)
    return Image.fromarray(array)
