"""The node vocabulary: the nouns a node declaration and a node's call share with the use cases. Socket types,
the choices of the nodes' inputs (dtypes, devices, memory plans, attention backends, fp8 rounding, schedulers,
video formats, MiniMax tasks, the denoisers a LoRA attaches to), the records the verbs take (handles, sampler
options, host contracts) and the errors a node catches. The verbs themselves are ``usecases.verbs``.

Why one module: a node module imports the use-case layer only, never the engine, yet its declaration needs these
names. Before, the use-case package handed them out one by one through a table of strings that no editor or type
checker could follow; here each is a plain import (or definition) that leads to where it is defined and checked.

The socket types are defined here: they name the edges of a graph, which the engine knows nothing of. The choices
stay defined where they are enforced (the engine refuses a dtype, memory plan or attention backend outside them,
the sampler a scheduler) and are imported from there, so a declaration cannot offer what the loader refuses.
"""

from ..loaders.contract_types import MAX_STEPS
from ..loaders.errors import ComponentUnnamedError, LoraBindError, LoraFileError
from ..loaders.families import lora_components
from ..loaders.fp8 import ROUNDINGS
from ..loaders.handles import AdapterHandle
from ..loaders.io.read_deadline import DeadlinePassed
from ..loaders.io.video_files import VIDEO_FORMATS, VIDEO_PRESETS
from ..loaders.models.store import DTYPE_NAMES
from ..loaders.placement.devices import MEMORY_NAMES, device_choices
from ..loaders.placement.speed import ATTENTION_NAMES
from .host_models import PART_ANY, PART_HIGH, PART_LOW, HostContract
from .host_sampling import HostGuidance, HostRun
from .minimax import MAX_REFERENCE_IMAGES, TASKS
from .sampling import END_OF_SCHEDULE, SCHEDULER_CHOICES, SampleOptions

# Our own socket types, so that inside ComfyUI they cannot be wired into core nodes expecting ComfyUI's
# MODEL/CONDITIONING/LATENT objects; the last three are ComfyUI's own, so its image, sigma and audio nodes connect.
SOCKET_MODEL = "LORABIND_MODEL"
SOCKET_CONDITIONING = "LORABIND_CONDITIONING"
SOCKET_LATENT = "LORABIND_LATENT"
SOCKET_ADAPTER = "LORABIND_ADAPTER"
SOCKET_SCHEDULE = "LORABIND_SCHEDULE"
SOCKET_IMAGE = "IMAGE"  # ComfyUI's own: float [B, H, W, C] in 0..1
SOCKET_SIGMAS = "SIGMAS"  # ComfyUI's own: 1-D float tensor ending in 0
SOCKET_AUDIO = "AUDIO"  # ComfyUI's own: {"waveform": [B, C, T], "sample_rate": int}

# what a node may import from here (ruff's F401 reads it: an import missing here is reported unused)
__all__ = [
    "SOCKET_ADAPTER", "SOCKET_AUDIO", "SOCKET_CONDITIONING", "SOCKET_IMAGE", "SOCKET_LATENT", "SOCKET_MODEL",
    "SOCKET_SCHEDULE", "SOCKET_SIGMAS",
    "ATTENTION_NAMES", "DTYPE_NAMES", "MEMORY_NAMES", "ROUNDINGS", "SCHEDULER_CHOICES", "TASKS", "VIDEO_FORMATS",
    "VIDEO_PRESETS", "device_choices", "lora_components",
    "END_OF_SCHEDULE", "MAX_REFERENCE_IMAGES", "MAX_STEPS", "PART_ANY", "PART_HIGH", "PART_LOW",
    "AdapterHandle", "HostContract", "HostGuidance", "HostRun", "SampleOptions",
    "ComponentUnnamedError", "DeadlinePassed", "LoraBindError", "LoraFileError",
]
