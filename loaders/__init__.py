"""The LoRA engine: a pure library (no graph, ComfyUI or HTTP imports).

Every LoRA file format converts into one canonical representation (``loaders.lora``); one module per model
family under ``loaders.families`` holds its key maps and sampling contracts; ``loaders.binding.patching`` fuses and
restores weights exactly; ``loaders.binding.peft_adapters`` manages dynamic adapters; ``loaders.binding`` brings a
shared model to the state a handle (``loaders.handles``) asks for.
"""

import logging as _logging


class _KnownFallbackFilter(_logging.Filter):
    """transformers 5 without torchvision says, when diffusers' Wan I2V pipeline module imports
    ``CLIPImageProcessor``, that it falls back to ``CLIPImageProcessorPil``. That fallback is what we use on
    purpose (``families/wan/image_conditioning.clip_image_processor``), so the line only alarms a newcomer at
    start (issue 30). Only that message is dropped; every other transformers warning still shows."""

    def filter(self, record: _logging.LogRecord) -> bool:
        message = record.getMessage()
        return not ("requires torchvision (not installed); falling back to" in message
                    and "ImageProcessorPil" in message)


_logging.getLogger("transformers.utils.import_utils").addFilter(_KnownFallbackFilter())
