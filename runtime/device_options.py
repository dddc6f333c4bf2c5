"""``--device`` / ``--memory`` / ``--load-workers`` of ``lorabind run`` and ``lorabind serve``: defaults for every
model loader.

They set what ``auto`` means for the loader's ``device`` and ``memory`` inputs (``loaders.placement.devices`` session
defaults), so existing workflows and API prompts, which name neither or say ``auto``, follow the command line
while a loader that names a device keeps it. ``--load-workers`` (vllm-omni's ``--num-weight-load-threads``) sets
the threads that read a sharded model's weight files, through ``$LORABIND_LOAD_WORKERS``, which every load of this
process and the ranks it starts read. No torch import here: ``lorabind --help`` stays fast.
"""

from __future__ import annotations

import os

MEMORY_CHOICES = ("auto", "full", "swap_experts", "offload_model", "offload_blocks")


def add_device_arguments(parser) -> None:
    parser.add_argument("--device", default=None, metavar="DEVICE",
                        help="device for every model loader left on auto: auto, cpu, cuda, cuda:N or mps "
                        "(default auto: CUDA, then MPS, then the CPU)")
    parser.add_argument("--memory", default=None, choices=MEMORY_CHOICES,
                        help="memory plan for every model loader left on auto (default auto: the cheapest plan "
                        "that fits the free device memory; see `lorabind plan`)")
    parser.add_argument("--load-workers", "--num-weight-load-threads", dest="load_workers", type=int, default=None,
                        metavar="N", help="threads reading a sharded model's weight files (default: one per usable "
                        "core, at most 8; 1 on a rotating disk whose files are not already in the page cache)")


def apply_device_arguments(args) -> str | None:
    """Install the session defaults; a user-facing error text when ``--device`` is not a device name."""
    # lazy: the CLI's parser imports this module; the engine loads when a device is resolved
    from ..loaders.errors import LoraBindError
    from ..loaders.placement.devices import set_session_defaults

    try:
        set_session_defaults(device=getattr(args, "device", None), memory=getattr(args, "memory", None))
    except LoraBindError as exc:
        return f"--device: {exc}"
    return apply_load_workers(getattr(args, "load_workers", None))


def apply_load_workers(workers) -> str | None:
    """Set the weight-loading threads (None: the loader's own rule); an error text for a count below 1."""
    if workers is None:
        return None
    if workers < 1:
        return f"--load-workers must be at least 1, got {workers}"
    # lazy: the CLI's parser imports this module; the engine loads when it runs
    from ..loaders.models.diffusers_folder import LOAD_WORKERS_VARIABLE

    os.environ[LOAD_WORKERS_VARIABLE] = str(workers)  # read by every model load of this process and its ranks
    return None
