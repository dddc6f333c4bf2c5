"""Live sampling previews in the headless hosts: the flags (ComfyUI's ``--preview-method`` and ``--preview-size``,
our ``--preview-interval``), how a prompt's settings travel to its executor, and the event that carries a preview.

Why through the prompt's ``extra_data``: ComfyUI 0.30 takes a per-prompt ``preview_method`` there (its frontend
sends the user's setting), and every executor a prompt can reach (the worker's, a Ray replica's, each rank's) is
handed ``extra_data`` already. The worker writes the settings under ``EXTRA_DATA_KEY`` into the copy it executes,
not into the queued prompt, so ``/history`` keeps what the client sent and a client cannot set the size or rate.
No torch here: ``serve`` and ``run`` add these flags on the CLI's fast path.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

PREVIEW_METHODS = ("none", "auto", "latent2rgb", "taesd")  # ComfyUI's --preview-method; auto is latent2rgb
EXTRA_DATA_KEY = "lorabind_previews"
PREVIEW_EVENT = "lorabind_preview"  # executor event: {prompt_id, node, value, max, image (bytes), image_type}
DEFAULT_SIZE = 512  # ComfyUI's --preview-size
MAX_SIZE = 4096
DEFAULT_INTERVAL_MS = 100  # at most ten previews a second per prompt (the last step's always goes out)


@dataclass(frozen=True)
class PreviewOptions:
    """How a prompt's sampler previews its steps: ``method`` (none: nothing is computed), the largest side of a
    preview in pixels, and the shortest time between two previews of one sampler run."""

    method: str = "none"
    max_size: int = DEFAULT_SIZE
    interval_ms: int = DEFAULT_INTERVAL_MS

    def for_prompt(self, extra_data: dict) -> dict:
        """The settings a prompt runs with (the value of ``EXTRA_DATA_KEY``): the client's ``preview_method``
        when it names a method (ComfyUI 0.30's rule; "default" or anything else keeps the host's)."""
        asked = extra_data.get("preview_method") if isinstance(extra_data, dict) else None
        method = asked if asked in PREVIEW_METHODS else self.method
        return {"method": method, "max_size": self.max_size, "interval_ms": self.interval_ms}

    @staticmethod
    def of_prompt(extra_data: dict) -> Optional["PreviewOptions"]:
        """The settings the host wrote into ``extra_data``, or None when it wrote none or they ask for no previews
        (then the sampler computes nothing for them)."""
        settings = extra_data.get(EXTRA_DATA_KEY) if isinstance(extra_data, dict) else None
        if not isinstance(settings, dict) or settings.get("method") not in PREVIEW_METHODS[1:]:
            return None
        return PreviewOptions(settings["method"], int(settings["max_size"]), int(settings["interval_ms"]))


NO_PREVIEWS = PreviewOptions()


def add_preview_arguments(parser, default_method: str) -> None:
    parser.add_argument("--preview-method", choices=PREVIEW_METHODS, default=default_method,
                        help=f"live previews of the sampler's steps, as ComfyUI's flag (default {default_method}): "
                        "auto and latent2rgb map each step's latent to colours (a fraction of a millisecond); taesd "
                        "is ComfyUI's decoder and previews with latent2rgb here; none computes nothing")
    parser.add_argument("--preview-size", type=int, default=DEFAULT_SIZE, metavar="PIXELS",
                        help=f"largest side of a preview, as ComfyUI's flag (default {DEFAULT_SIZE})")
    parser.add_argument("--preview-interval", type=int, default=DEFAULT_INTERVAL_MS, metavar="MS",
                        help=f"shortest time between two previews of one sampler (default {DEFAULT_INTERVAL_MS}; "
                        "0: every step); the last step's preview is always sent")


def preview_options(args) -> PreviewOptions | str:
    """The flags' ``PreviewOptions``, or an error text naming the flag."""
    if not 16 <= args.preview_size <= MAX_SIZE:
        return f"--preview-size must be from 16 to {MAX_SIZE} pixels, got {args.preview_size}"
    if args.preview_interval < 0:
        return f"--preview-interval must be 0 or more milliseconds, got {args.preview_interval}"
    return PreviewOptions(args.preview_method, args.preview_size, args.preview_interval)
