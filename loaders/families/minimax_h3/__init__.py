"""MiniMax-H3: the family object (``FAMILY``) and the package's public functions.

Modules: ``keymap`` (LoRA names, fused-layer rewrites), ``contracts`` (Turbo / native / checkpoint-pinned
contracts and their wording), ``resolve`` (a request against them: two schedules, a task, a partition),
``pipeline`` (load, encode, latents, first frame, decode), ``prediction`` (the packed sequence and one forward),
``references`` (ref2va reference images), ``sampling`` (the two-schedule Euler loop), ``family`` (the
``ModelFamily`` implementation).
"""

from .contracts import (  # noqa: F401  (the package's public contract functions)
    NATIVE_KEY_FORMAT,
    NATIVE_QKV_LAYOUT,
    TASKS,
    TURBO_GRAMMAR,
    TURBO_KEY_FORMAT,
    checkpoint_contract,
    contract_dict,
    declared_contract,
    describe_contract,
    file_contract,
    native_contract,
    on_checkpoint,
    parse_turbo_name,
    with_scale,
)
from .family import MiniMaxH3Family
from .keymap import map_target, prepare, recognizes, reorder_grouped_qkv  # noqa: F401
from .pipeline import decode, decode_audio, empty_latents, encode_prompt, implied_task, with_first_frame  # noqa: F401
from .references import MAX_IMAGE_REFERENCES, with_references  # noqa: F401
from .resolve import resolve as resolve_schedule  # noqa: F401
from .sampling import check_inputs  # noqa: F401

FAMILY = MiniMaxH3Family()
FAMILY_ID = FAMILY.id
