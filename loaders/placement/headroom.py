"""What ``lorabind plan`` keeps free of a machine's memory, stated in every answer: a plan that peaks at 11.8 of a
12 GiB card runs out when the CUDA context, the desktop and other programs have taken their share.

The amounts follow ComfyUI, so a user who runs both sees the same machine (ComfyUI 0.30's
``comfy/model_management.py`` and ``main.py``, read for the figures only):

* **Reserved device memory** (``EXTRA_RESERVED_VRAM``): 0.4 GiB on Linux and macOS, 0.6 GiB on Windows (the
  desktop shares the card there), 0.1 GiB more on Windows cards over 15 GiB. ``--reserve-vram GIB`` replaces it,
  as ComfyUI's flag of that name does.
* **The CUDA context**: ComfyUI reads the free memory after torch has created it, so its reserve comes on top of
  it; ``--vram`` is the card's memory as a user knows it, so the context is subtracted here:
  ``CUDA_CONTEXT_BYTES``, the CUDA runtime, cuBLAS's workspace and torch's kernels loaded lazily (0.3 to 0.6 GiB
  with CUDA 12 depending on the card; the larger figure is kept, not measured here: no GPU was lent).
* **Host memory for the OS and other programs**: ComfyUI keeps 10 % of the machine's RAM free, at least 2 and at
  most 10 GiB (its ``--cache-ram`` default, the RAM it frees models to keep available).
"""

from __future__ import annotations

import platform
from dataclasses import dataclass

GIB = 1024**3
CUDA_CONTEXT_BYTES = GIB // 2
RESERVED_VRAM_BYTES = 400 * 1024**2  # ComfyUI's EXTRA_RESERVED_VRAM on Linux and macOS
WINDOWS_RESERVED_VRAM_BYTES = 600 * 1024**2
WINDOWS_LARGE_CARD_BYTES = 100 * 1024**2  # added on Windows for cards over 15 GiB
LARGE_CARD_GIB = 15
HOST_SHARE = 0.10
HOST_MIN_BYTES, HOST_MAX_BYTES = 2 * GIB, 10 * GIB


@dataclass(frozen=True)
class Headroom:
    """Bytes kept free: on the device (the CUDA context and the reserve) and on the host."""

    cuda_context_bytes: int = 0
    reserved_vram_bytes: int = 0
    host_bytes: int = 0
    reserve_given: bool = False  # --reserve-vram replaced ComfyUI's default

    @property
    def device_bytes(self) -> int:
        return self.cuda_context_bytes + self.reserved_vram_bytes

    def usable(self, stated_gib: float | None, kept: int) -> int | None:
        """Bytes of ``stated_gib`` left to the plan once ``kept`` bytes are set aside (None: not stated)."""
        return None if stated_gib is None else max(int(stated_gib * GIB) - kept, 0)

    def describe(self, device: str, host_stated: bool = True) -> str:
        """One line: what is kept free and why (the host's only when its memory was stated)."""
        host = (f"host {self.host_bytes / GIB:.1f} GiB (the OS and other programs: 10 % of the RAM, 2 to 10 GiB, "
                "as ComfyUI keeps free)") if host_stated else ""
        if device == "cpu":
            return f"headroom kept free: {host}"
        reserve = "--reserve-vram" if self.reserve_given else "ComfyUI's default for this OS; --reserve-vram GIB"
        return ", ".join(filter(None, [
            f"headroom kept free: device {self.device_bytes / GIB:.1f} GiB (CUDA context "
            f"{self.cuda_context_bytes / GIB:.1f} GiB, desktop and other programs "
            f"{self.reserved_vram_bytes / GIB:.1f} GiB: {reserve})", host]))

    def to_json(self) -> dict:
        return {"device_bytes": self.device_bytes, "cuda_context_bytes": self.cuda_context_bytes,
                "reserved_vram_bytes": self.reserved_vram_bytes, "host_bytes": self.host_bytes}


def reserved_vram_bytes(vram_gib: float, windows: bool) -> int:
    """ComfyUI's default reserve for a card of ``vram_gib`` GiB."""
    if not windows:
        return RESERVED_VRAM_BYTES
    return WINDOWS_RESERVED_VRAM_BYTES + (WINDOWS_LARGE_CARD_BYTES if vram_gib > LARGE_CARD_GIB else 0)


def host_headroom_bytes(ram_gib: float | None) -> int:
    """10 % of the RAM, at least 2 and at most 10 GiB (never more than there is)."""
    if ram_gib is None:
        return 0
    ram = int(ram_gib * GIB)
    return min(ram, max(HOST_MIN_BYTES, min(HOST_MAX_BYTES, int(ram * HOST_SHARE))))


def machine_headroom(device: str, vram_gib: float | None, ram_gib: float | None,
                     reserve_vram_gib: float | None = None, windows: bool | None = None) -> Headroom:
    """The headroom of a machine with ``vram_gib`` of device memory (None on the CPU) and ``ram_gib`` of RAM;
    ``windows`` defaults to the OS ``plan`` runs on, as ComfyUI's reserve does."""
    host = host_headroom_bytes(ram_gib)
    if device == "cpu" or vram_gib is None:
        return Headroom(host_bytes=host)
    if windows is None:
        windows = platform.system() == "Windows"
    reserve = (int(reserve_vram_gib * GIB) if reserve_vram_gib is not None
               else reserved_vram_bytes(vram_gib, windows))
    return Headroom(CUDA_CONTEXT_BYTES, reserve, host, reserve_vram_gib is not None)
