"""The use-case facade: every verb a node calls, by plain import, so an editor or a type checker follows each one
to its definition. The nouns a node declares and passes (socket types, choices, records, errors) are
``usecases.vocabulary``.

Most verbs are the use cases' own (models, adapters, host models, sampling, MiniMax-H3). The rest are engine
steps a node runs as they are, with no rule of the use-case layer around them (encoding, latents, decoding,
contract look-ups for the editor, the output writers, the device-memory controls); they are named here so that a
node still imports the use-case layer only (``tests/test_package_structure.py``). Like any plain import, a node
holds the function itself: a test that replaces a verb patches it in the node module that calls it.

Why a module of its own, not the package's ``__init__``: Python runs a package's ``__init__`` before any of its
submodules, and the CLI's fast start (``lorabind --help`` without torch, ``tests/test_package_layout.py``)
imports ``usecases.host`` and ``usecases.model_folders``. A facade there, imported normally, would load torch for
every ``lorabind`` command; made lazy, no checker could follow it. So ``usecases/__init__`` stays empty and the
facade is this module, which nothing on the fast start imports.
"""

from ..loaders.contracts.table import table_versions as contract_table_versions
from ..loaders.dispatch.contract_discovery import lora_file_contract, model_file_contract, model_folder_contract
from ..loaders.dispatch.generation_steps import (
                                                 control_video_latent,
                                                 decode,
                                                 empty_latent,
                                                 encode_text,
                                                 encode_with_images,
                                                 image_to_video_latent,
)
from ..loaders.io.atomic_files import write_atomically
from ..loaders.io.file_identity import file_identity
from ..loaders.io.read_deadline import read_deadline
from ..loaders.io.video_files import write_video
from ..loaders.io.wav_files import write_wav
from ..loaders.models.store import follow_host_node_cache, release_device_memory
from .adapters import attach_adapter, attach_fuse, attach_fuses, expert_slots
from .host_models import (
                                                 check_expert_pair,
                                                 check_lora_expert,
                                                 check_stacking,
                                                 host_expert,
                                                 host_family,
                                                 host_patched_value,
                                                 prepare_host_lora,
                                                 sigma_table,
                                                 switch_step,
)
from .host_sampling import check_sampling, check_step
from .minimax import check_contract, decode_audio, with_first_frame, with_reference_images
from .models import (
                                                 builtin_file_names,
                                                 builtin_model_names,
                                                 ensure_builtin_files,
                                                 ensure_builtins_for_prompt,
                                                 find_model,
                                                 gguf_denoiser_names,
                                                 list_models,
                                                 load_checkpoint_files,
                                                 load_model,
                                                 load_repository_model,
                                                 model_version,
                                                 repository_files_stat,
                                                 resolve_model,
                                                 tokenizer_dirs,
)
from .previews import preview_map, step_previewer
from .sampling import plan_sampling, sample, schedule_sigmas, split_sigmas

# what a node may import from here (ruff's F401 reads it: an import missing here is reported unused)
__all__ = [
    # models (usecases.models)
    "builtin_file_names", "builtin_model_names", "ensure_builtin_files", "ensure_builtins_for_prompt", "find_model",
    "gguf_denoiser_names", "list_models", "load_checkpoint_files", "load_model", "load_repository_model",
    "model_version", "repository_files_stat", "resolve_model", "tokenizer_dirs",
    # LoRAs on our own model (usecases.adapters)
    "attach_adapter", "attach_fuse", "attach_fuses", "expert_slots",
    # LoRAs and contracts on a host's own model (usecases.host_models)
    "check_expert_pair", "check_lora_expert", "check_stacking", "host_expert", "host_family", "host_patched_value",
    "prepare_host_lora", "sigma_table", "switch_step",
    # a host sampler run against those contracts (usecases.host_sampling)
    "check_sampling", "check_step",
    # sampling (usecases.sampling)
    "plan_sampling", "sample", "schedule_sigmas", "split_sigmas",
    # live previews of the sampler's steps (usecases.previews)
    "preview_map", "step_previewer",
    # MiniMax-H3 (usecases.minimax)
    "check_contract", "decode_audio", "with_first_frame", "with_reference_images",
    # engine steps a node runs as they are
    "control_video_latent", "decode", "empty_latent", "encode_text", "encode_with_images", "image_to_video_latent",
    "contract_table_versions", "lora_file_contract", "model_file_contract", "model_folder_contract",
    "file_identity", "read_deadline", "write_atomically", "write_video", "write_wav",
    "follow_host_node_cache", "release_device_memory",
]
