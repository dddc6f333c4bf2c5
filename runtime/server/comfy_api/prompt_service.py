"""What ``POST /prompt`` and the OpenAI-style endpoints both do before they queue a prompt: build the built-in
tiny models it names, validate it, and refuse the sampling-contract mismatches a file declares.

Its own module rather than a function of ``routes_prompt``: the OpenAI routes queue prompts too, and they
should depend on this service, not on another API's route module.
"""

from __future__ import annotations

from ....tiny_models import ensure_builtin_models
from ....usecases.prompt_contracts import early_refusals_by_input, unreadable_lora_refusals, wrong_family_refusals
from ... import folder_paths
from ...executor.graph import upstream_closure
from ...executor.validation import ValidationResult
from .. import prompt_log
from ..composition_root import ServerState


def validate_prompt(state: ServerState, prompt: dict, targets):
    """Build any missing built-in tiny model and example input image the prompt names (as ``lorabind run``
    does, so the example workflows work on a fresh models root), then validate — the model lists in COMBO inputs
    now include it. While ``lorabind serve`` still builds the examples' models, wait for them (not a refusal)."""
    state.models_built.wait()
    ensure_builtin_models(prompt, state.config.models_root, state.config.input_dir, announce=prompt_log.log.info)
    result = state.validator.validate(prompt, targets)
    return _refuse_contract_mismatches(state, result) if result.ok else result


def _refuse_contract_mismatches(state: ServerState, result):
    """The valid prompt, or a failed validation naming each sampler whose literal inputs (steps, scheduler, shift,
    cfg, boundary) a file upstream of it contradicts: the check ``lorabind run`` makes before anything runs (the
    LoRA files, read once and cached for the run, and the folders' ``model_index.json``; no model), so a
    mismatched prompt is a 400 now rather than an error minutes into the run, after the model load. A LoRA input
    naming a file that cannot be a safetensors file (0 bytes), or a LoRA of another model family than its model,
    is refused here too, for the same reason."""
    errors = [(node_id, name, refusal_error(CONTRACT_MISMATCH, "Value breaks a file's sampling contract", message,
                                            name, result.prompt[node_id]["inputs"].get(name)))
              for node_id, name, message in early_refusals_by_input(result.prompt, state.node_classes, folder_paths)]
    errors += [(node_id, name, refusal_error(INVALID_LORA_FILE, "Value is not a safetensors file", message, name,
                                             result.prompt[node_id]["inputs"][name]))
               for node_id, name, message in unreadable_lora_refusals(result.prompt, folder_paths)]
    errors += [(node_id, name, refusal_error(WRONG_FAMILY, "Value is a LoRA for another model", message, name,
                                             result.prompt[node_id]["inputs"][name]))
               for node_id, name, message in wrong_family_refusals(result.prompt, state.node_classes, folder_paths)]
    if not errors:
        return result
    node_errors: dict = {}
    for node_id, _, error in errors:
        entry = node_errors.setdefault(node_id, {
            "errors": [], "dependent_outputs": [o for o in result.outputs if node_id in upstream_closure(result.prompt, [o])],
            "class_type": result.prompt[node_id]["class_type"]})
        entry["errors"].append(error)
    details = "\n".join(f"node {node_id}: {error['details']}" for node_id, _, error in errors)
    error = {"type": "prompt_outputs_failed_validation", "message": "Prompt outputs failed validation",
             "details": details, "extra_info": {}}
    return ValidationResult(False, error, [], node_errors, result.prompt)


def refusal_error(kind: str, message: str, details: str, input_name: str, value) -> dict:
    """A node error frontend 1.58.1 shows with its text. It renders only the types ComfyUI sends, and of those
    only the exception types put ``details`` in the toast as well as the Issues panel (``custom_validation_failed``,
    ComfyUI's type for a node's own check, shows its details in the panel only; an unknown type shows neither).
    ``exception_during_inner_validation`` is ComfyUI's type for an input whose upstream node could not be
    validated, which is what ours are: a file named upstream contradicts ``steps``, or is no safetensors file.
    Our own ``kind`` stays machine-readable in ``extra_info["lorabind_refusal"]``."""
    return {"type": "exception_during_inner_validation", "message": message, "details": details,
            "extra_info": {"input_name": input_name, "received_value": value, REFUSAL_KEY: kind}}


REFUSAL_KEY = "lorabind_refusal"
CONTRACT_MISMATCH = "contract_mismatch"
INVALID_LORA_FILE = "invalid_lora_file"
WRONG_FAMILY = "lora_for_another_family"
