"""The one transformers warning a Wan model would print on every start, dropped where it is said.

transformers 5 without torchvision says, when diffusers' Wan I2V pipeline module imports ``CLIPImageProcessor``,
that it falls back to ``CLIPImageProcessorPil``. That fallback is what we use on purpose
(``image_conditioning.clip_image_processor``), so the line only alarms a newcomer (issue 30). Why installed by the
Wan package: only Wan imports that pipeline module, and every path to it (loading, single files, the tiny-model
factory) imports this package first; the rest of the engine leaves logging alone.
"""

from __future__ import annotations

import logging

_LOGGER = "transformers.utils.import_utils"


class KnownFallbackFilter(logging.Filter):
    """Drops only the image-processor fallback line; every other transformers warning still shows."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not ("requires torchvision (not installed); falling back to" in message
                    and "ImageProcessorPil" in message)


def install() -> None:
    """Add the filter to transformers' import logger once (a second call adds nothing)."""
    logger = logging.getLogger(_LOGGER)
    if not any(isinstance(f, KnownFallbackFilter) for f in logger.filters):
        logger.addFilter(KnownFallbackFilter())
