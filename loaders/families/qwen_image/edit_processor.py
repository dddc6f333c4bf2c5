"""The Qwen2-VL processor the Qwen-Image-Edit pipelines call, built from a folder's ``processor/`` files.

Why our own constructor: transformers 5's ``Qwen2VLProcessor`` also builds a video processor, which needs
torchvision; without it the class cannot be constructed at all (``ProcessorMixin``'s argument check fails), even
though an edit prompt never holds a video. ``image_only_processor`` makes a ``Qwen2VLProcessor`` from the image
processor and the tokenizer alone, so the pipelines run transformers' own processing (``<|image_pad|>`` expanded
to the image's merged patch count, ``pixel_values``, ``image_grid_thw``) with or without torchvision.
"""

from __future__ import annotations

import os

IMAGE_TOKEN = "<|image_pad|>"
VIDEO_TOKEN = "<|video_pad|>"
PROCESSOR_FOLDER = "processor"  # where the published edit folders keep the tokenizer and preprocessor_config.json


def _image_processor_class():
    try:
        from transformers import Qwen2VLImageProcessorPil as image_processor_class
    except ImportError:  # transformers 4.x: one implementation, torchvision-free
        from transformers import Qwen2VLImageProcessor as image_processor_class
    return image_processor_class


def image_only_processor(image_processor, tokenizer):
    """A ``Qwen2VLProcessor`` holding ``image_processor`` and ``tokenizer`` and no video processor."""
    from transformers import Qwen2VLProcessor

    class ImageOnlyQwen2VLProcessor(Qwen2VLProcessor):
        """Qwen2VLProcessor without its video half (constructed without ``ProcessorMixin``'s checks)."""

        def __init__(self, image_processor, tokenizer):  # noqa: D401 - see the module docstring for why
            self.image_processor, self.tokenizer, self.video_processor = image_processor, tokenizer, None
            self.chat_template = None
            self.image_token, self.video_token = IMAGE_TOKEN, VIDEO_TOKEN
            self.image_token_id = tokenizer.convert_tokens_to_ids(IMAGE_TOKEN)
            self.video_token_id = tokenizer.convert_tokens_to_ids(VIDEO_TOKEN)

        def save_pretrained(self, save_directory, **kwargs):
            """The published ``processor/`` layout: the tokenizer files and ``preprocessor_config.json`` (the
            mixin's own saving also wants the video processor)."""
            self.tokenizer.save_pretrained(save_directory)
            self.image_processor.save_pretrained(save_directory)
            return []

    return ImageOnlyQwen2VLProcessor(image_processor, tokenizer)


def new_image_processor(**options):
    """Qwen2-VL's image processor (14-pixel patches, 2x2 merge) with ``options`` (``min_pixels``/``max_pixels``)."""
    return _image_processor_class()(**options)


def load_processor(folder: str):
    """The processor of a diffusers edit folder (``<folder>/processor``), read offline."""
    from transformers import AutoTokenizer

    path = os.path.join(folder, PROCESSOR_FOLDER)
    return load_processor_files(path, AutoTokenizer.from_pretrained(path, local_files_only=True))


def load_processor_files(path: str, tokenizer):
    """The processor from the image processor files in ``path`` and ``tokenizer``, read offline."""
    image_processor = _image_processor_class().from_pretrained(path, local_files_only=True)
    return image_only_processor(image_processor, tokenizer)
