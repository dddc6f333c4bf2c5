"""``--device`` / ``--memory`` of ``lorabind run`` and ``lorabind serve``: defaults for every model loader.

They set what ``auto`` means for the loader's ``device`` and ``memory`` inputs (``loaders.placement.devices`` session
defaults), so existing workflows and API prompts, which name neither or say ``auto``, follow the command line
while a loader that names a device keeps it. No torch import here: ``lorabind --help`` stays fast.
"""

from __future__ import annotations

MEMORY_CHOICES = ("auto", "full", "swap_experts", "offload_model", "offload_blocks")


def add_device_arguments(parser) -> None:
    parser.add_argument("--device", default=None, metavar="DEVICE",
                        help="device for every model loader left on auto: auto, cpu, cuda, cuda:N or mps "
                        "(default auto: CUDA, then MPS, then the CPU)")
    parser.add_argument("--memory", default=None, choices=MEMORY_CHOICES,
                        help="memory plan for every model loader left on auto (default auto: the cheapest plan "
                        "that fits the free device memory; see `lorabind plan`)")


def apply_device_arguments(args) -> str | None:
    """Install the session defaults; a user-facing error text when ``--device`` is not a device name."""
    # lazy: the CLI's parser imports this module; the engine loads when a device is resolved
    from ..loaders.errors import LoraBindError
    from ..loaders.placement.devices import set_session_defaults

    try:
        set_session_defaults(device=getattr(args, "device", None), memory=getattr(args, "memory", None))
    except LoraBindError as exc:
        return f"--device: {exc}"
    return None
