"""The use-case layer: what the hosts (ComfyUI nodes, ``lorabind run``, ``lorabind serve``) ask of the engine.

Why: the rules that are neither a node's declaration nor engine mechanics (which denoiser a file goes to, the
sampler's order of checks, composing a contract, listing and resolving models, finding tokenizers) live here once,
so every host runs them the same way. Nodes import this one facade, never the engine's modules. The facade is
lazy (PEP 562): ``usecases.host`` and ``usecases.model_folders`` stay torch-free for the CLI's fast start.

Verbs: ``list_models``, ``find_model``, ``model_index_stat``, ``resolve_model``, ``load_model``, ``load_checkpoint_files``,
``tokenizer_dirs``, ``gguf_denoiser_names``, ``builtin_model_names``/``builtin_file_names``/``ensure_builtin_files`` (the built-ins a host
offers through ``usecases.host``) (models); ``prepare_host_lora``, ``check_stacking``, ``check_sampling``, ``check_expert_pair`` (LoRAs and
contracts on a host's own model: the ComfyUI-native nodes); ``attach_fuse``, ``attach_fuses``, ``attach_adapter``, ``expert_slots``,
``lora_components`` (adapters); ``sample``, ``plan_sampling``, ``schedule_sigmas``, ``split_sigmas`` (sampling);
``check_contract``, ``decode_audio``, ``with_first_frame``, ``with_reference_images`` (MiniMax-H3); plus the engine
names a node declaration needs (socket types, choices, handles, errors).
"""

import sys
from importlib import import_module
from importlib.util import resolve_name

_EXPORTS = {
    ".models": ("list_models", "find_model", "model_index_stat", "resolve_model", "load_model",
                "load_checkpoint_files", "tokenizer_dirs", "builtin_model_names", "builtin_file_names",
                "ensure_builtin_files", "gguf_denoiser_names", "MODEL_FOLDER_KIND", "TOKENIZER_KIND"),
    ".adapters": ("attach_fuse", "attach_fuses", "attach_adapter", "expert_slots", "accounting_text",
                  "contract_text"),
    ".host_models": ("prepare_host_lora", "host_family", "host_patched_value", "check_expert_pair", "check_sampling",
                     "check_stacking", "sigma_table", "switch_step", "HostContract", "PART_ALL", "PART_HIGH",
                     "PART_LOW", "PART_ANY"),
    ".sampling": ("sample", "plan_sampling", "SamplingPlan", "SampleOptions", "schedule_report", "schedule_sigmas",
                  "split_sigmas", "END_OF_SCHEDULE", "SCHEDULER_CHOICES"),
    ".minimax": ("check_contract", "decode_audio", "with_first_frame", "with_reference_images", "TASKS",
                 "MAX_REFERENCE_IMAGES"),
    "..loaders.families": ("lora_components",),
    "..loaders.handles": ("SOCKET_ADAPTER", "SOCKET_AUDIO", "SOCKET_CONDITIONING", "SOCKET_IMAGE",
                          "SOCKET_LATENT", "SOCKET_MODEL", "SOCKET_SCHEDULE", "SOCKET_SIGMAS", "AdapterHandle",
                          "ModelHandle"),
    "..loaders.errors": ("LoraBindError", "LoraFileError"),
    "..loaders.dispatch.generation_steps": ("encode_text", "encode_with_images", "empty_latent",
                                            "image_to_video_latent", "control_video_latent", "decode"),
    "..loaders.dispatch.contract_discovery": ("lora_file_contract", "model_folder_contract", "model_file_contract"),
    "..loaders.placement.devices": ("MEMORY_NAMES", "device_choices"),
    "..loaders.models.store": ("DTYPE_NAMES", "release_device_memory", "follow_host_node_cache"),
    "..loaders.placement.speed": ("ATTENTION_NAMES",),
    "..loaders.fp8": ("ROUNDINGS",),
    "..loaders.io.file_identity": ("file_identity",),
    "..loaders.io.atomic_files": ("write_atomically",),
    "..loaders.io.wav_files": ("write_wav",),
    "..loaders.io.video_files": ("write_video", "VIDEO_FORMATS", "VIDEO_PRESETS"),
}
_MODULE_OF = {name: resolve_name(module, __name__) for module, names in _EXPORTS.items() for name in names}


def __getattr__(name):
    """Looked up on every access, never copied here, so a name replaced in its module (a test's monkeypatch) is
    seen. A module already imported is taken from ``sys.modules``: nodes read several names per prompt, and going
    through the import machinery each time was a visible part of a seed-only rerun. One still being imported (by
    another thread) goes through ``import_module``, which waits for it."""
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    loaded = sys.modules.get(module)
    if loaded is None or getattr(getattr(loaded, "__spec__", None), "_initializing", False):
        loaded = import_module(module)
    return getattr(loaded, name)


def __dir__():
    return sorted(_MODULE_OF)
