"""Keep the tensors the savers are handed (as float32), so a test compares outputs before any 8-bit encoding."""

from __future__ import annotations

import contextlib
import inspect

import torch

from lorabind.nodes import minimax_nodes, output_nodes, video_nodes

SAVERS = ((output_nodes, "LoraBindSaveImage"), (minimax_nodes, "LoraBindSaveAudio"),
          (video_nodes, "LoraBindSaveVideo"))


@contextlib.contextmanager
def capturing_savers(on_capture=None):
    """Every tensor handed to a saver, keyed ``class:argument``, kept as float32 (the savers still write);
    ``on_capture(key, tensor)`` is told of each as it comes."""
    captured: dict[str, torch.Tensor] = {}
    originals = [(cls, cls.save) for cls in (getattr(m, name) for m, name in SAVERS)]

    def wrapping(cls, save):
        signature = inspect.signature(save)

        def capturing_save(node, *args, **kwargs):
            for name, value in signature.bind(node, *args, **kwargs).arguments.items():
                value = value["waveform"] if isinstance(value, dict) and "waveform" in value else value
                if isinstance(value, torch.Tensor):
                    key = f"{cls.__name__}:{name}"
                    captured[key] = value.detach().float().clone()
                    if on_capture is not None:
                        on_capture(key, captured[key])
            return save(node, *args, **kwargs)
        return capturing_save

    for cls, save in originals:
        cls.save = wrapping(cls, save)
    try:
        yield captured
    finally:
        for cls, save in originals:
            cls.save = save
