"""Which device a model runs on, how much memory is free there, and the session defaults for both.

Why a session default: ``lorabind run --device cuda:1 --memory swap_experts`` must apply to every loader of a
workflow without rewriting the workflow, and a workflow saved in the UI always carries ``device=auto``. So
``auto`` means "the session's default when one is set, else the best device present" (ComfyUI passes its own
``model_management`` device as that default through ``nodes/comfy_bridge``). An explicit value always wins.
"""

from __future__ import annotations

import functools
import threading

from ..errors import ModelLoadError

DEVICE_NAMES = ("auto", "cpu", "cuda", "mps")
MEMORY_NAMES = ("auto", "full", "swap_experts", "offload_model", "offload_blocks")

_defaults = {"device": None, "memory": None}
_defaults_lock = threading.Lock()


def set_session_defaults(*, device: str | None = None, memory: str | None = None) -> None:
    """What ``auto`` means for every loader of this process (``lorabind run/serve --device/--memory``).

    Values are checked here, so a bad ``--device`` fails at start-up rather than at the first prompt."""
    if device is not None:
        check_device_name(device)
    if memory is not None and memory not in MEMORY_NAMES:
        raise ModelLoadError(f"unknown memory plan {memory!r}; choose one of {list(MEMORY_NAMES)}")
    with _defaults_lock:
        _defaults["device"] = None if device in (None, "auto") else device
        _defaults["memory"] = None if memory in (None, "auto") else memory


def session_defaults() -> dict:
    with _defaults_lock:
        return dict(_defaults)


def device_choices() -> list[str]:
    """The loader's device options: the fixed names plus ``cuda:N`` for every CUDA device present."""
    return list(DEVICE_NAMES) + [f"cuda:{i}" for i in range(_cuda_device_count())]


@functools.cache
def _cuda_device_count() -> int:
    """Asked once: the CUDA runtime enumerates its devices once per process (``CUDA_VISIBLE_DEVICES`` is read at
    its start), and the loader's choices are listed for every prompt's validation."""
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def check_device_name(name: str) -> None:
    """Refuse a name that is not ``auto|cpu|cuda|cuda:N|mps`` (a typo must not silently mean the CPU)."""
    text = str(name)
    if text in DEVICE_NAMES:
        return
    kind, _, index = text.partition(":")
    if kind == "cuda" and index.isdigit():
        return
    raise ModelLoadError(f"unknown device {text!r}; choose auto, cpu, cuda, cuda:N or mps")


def auto_device() -> str:
    """CUDA when present, else Apple's MPS, else the CPU."""
    import torch

    if torch.cuda.is_available():
        return "cuda"
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        return "mps"
    return "cpu"


def resolve_device(name=None, *, default=None):
    """A ``torch.device`` for a loader's ``device`` input.

    ``auto``/None: ``default`` (e.g. ComfyUI's device), else the session default, else ``auto_device()``.
    A device that is not present raises ``ModelLoadError`` saying what is present.
    """
    import torch

    if isinstance(name, torch.device):
        name = str(name)
    if name in (None, "auto"):
        name = default if default is not None else (session_defaults()["device"] or auto_device())
    name = str(name)
    if name == "auto":
        name = auto_device()
    check_device_name(name)
    device = torch.device(name)
    if device.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise ModelLoadError(f"device {name!r}: this torch ({torch.__version__}) sees no CUDA device; "
                                 f"use device=cpu (or auto)")
        index = device.index if device.index is not None else torch.cuda.current_device()
        if index >= count:
            raise ModelLoadError(f"device {name!r}: only cuda:0..cuda:{count - 1} are present")
        return torch.device("cuda", index)
    if device.type == "mps":
        mps = getattr(torch.backends, "mps", None)
        if mps is None or not mps.is_available():
            raise ModelLoadError(f"device 'mps': not available in this torch ({torch.__version__}); use cpu or auto")
    return device


def resolve_memory(name=None) -> str:
    """A loader's ``memory`` input: ``auto``/None defers to the session default, else lets the planner choose."""
    if name in (None, "auto"):
        return session_defaults()["memory"] or "auto"
    if name not in MEMORY_NAMES:
        raise ModelLoadError(f"unknown memory plan {name!r}; choose one of {list(MEMORY_NAMES)}")
    return name


def host_memory() -> tuple[int, int]:
    """(total, available) bytes of system RAM; from /proc/meminfo, zeros where it cannot be read."""
    values = {}
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                key, _, rest = line.partition(":")
                values[key] = int(rest.split()[0]) * 1024
    except (OSError, ValueError, IndexError):
        return 0, 0
    return values.get("MemTotal", 0), values.get("MemAvailable", values.get("MemFree", 0))


def device_memory(device) -> tuple[int, int]:
    """(free, total) bytes on ``device``: ``torch.cuda.mem_get_info`` for CUDA; system RAM for the CPU and MPS
    (unified memory)."""
    import torch

    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)
    total, available = host_memory()
    return available, total
