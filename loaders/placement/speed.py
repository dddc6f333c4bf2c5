"""Speed options of a loaded model: the attention backend (diffusers' attention dispatcher) and regional compile.

Why these two and nothing of our own: diffusers already routes every attention call of its transformers through
``attention_dispatch`` (``set_attention_backend``), and ``compile_repeated_blocks`` compiles the one repeated
transformer block once instead of the whole model (minutes less compile time, the same speed-up). What we add is
refusing clearly: a backend whose package is missing, that the installed diffusers does not know, or that needs
CUDA on another device is named together with what is installed.
"""

from __future__ import annotations

import importlib.util

from ..errors import ModelLoadError

# our option -> (diffusers backend name, the package it needs or None, needs CUDA)
ATTENTION_BACKENDS = {
    "native": ("native", None, False),  # torch's scaled_dot_product_attention, the default
    "flash": ("flash", "flash_attn", True),
    "flash3": ("_flash_3", "flash_attn_interface", True),
    "sage": ("sage", "sageattention", True),
    "cudnn": ("_native_cudnn", None, True),
    "xformers": ("xformers", "xformers", True),
}
ATTENTION_NAMES = tuple(ATTENTION_BACKENDS)
MIN_DIFFUSERS_FOR_BACKENDS = "0.35"  # the first release with ModelMixin.set_attention_backend


def installed_attention_backends(device) -> list[str]:
    """The options of ``ATTENTION_BACKENDS`` usable here (package present; CUDA when needed)."""
    return [name for name, (_, package, cuda) in ATTENTION_BACKENDS.items()
            if (package is None or importlib.util.find_spec(package) is not None)
            and (not cuda or device.type == "cuda")]


def check_attention(name: str, device) -> None:
    """Refuse an unusable backend before anything is loaded, saying what is installed."""
    if name not in ATTENTION_BACKENDS:
        raise ModelLoadError(f"unknown attention backend {name!r}; choose one of {list(ATTENTION_NAMES)}")
    _, package, cuda = ATTENTION_BACKENDS[name]
    usable = ", ".join(installed_attention_backends(device))
    if cuda and device.type != "cuda":
        raise ModelLoadError(f"attention={name} needs a CUDA device, the model is on {device}; usable here: {usable}")
    if package is not None and importlib.util.find_spec(package) is None:
        raise ModelLoadError(f"attention={name} needs the Python package {package!r}, which is not installed; "
                             f"usable here: {usable}")


def apply_speed_options(denoisers: dict, *, attention: str = "native", compile: bool = False) -> None:
    """Set the attention backend on every denoiser and, with ``compile``, compile their repeated blocks."""
    for name, module in denoisers.items():
        if attention != "native":
            if not hasattr(module, "set_attention_backend"):
                import diffusers

                raise ModelLoadError(f"attention={attention}: {name} ({type(module).__name__}) cannot select an "
                                     f"attention backend in diffusers {diffusers.__version__}; it needs diffusers >= "
                                     f"{MIN_DIFFUSERS_FOR_BACKENDS}")
            try:
                module.set_attention_backend(ATTENTION_BACKENDS[attention][0])
            except (RuntimeError, ValueError) as exc:
                raise ModelLoadError(f"attention={attention} on {name}: {exc}") from exc
        if compile:
            if not getattr(module, "_repeated_blocks", None) or not hasattr(module, "compile_repeated_blocks"):
                raise ModelLoadError(f"compile: {name} ({type(module).__name__}) declares no repeated blocks to "
                                     "compile in the installed diffusers")
            module.compile_repeated_blocks(fullgraph=True)
