"""The last prompt that validated in full, so the next one re-checks only what changed (the seed of a rerun).

Why: validating the tiny Wan workflow was a quarter of the runtime's own work on a seed-only rerun, and almost all
of it re-derived what the previous prompt had already established. A node's validation depends on its class
declaration, its inputs, the classes it links to and whether they are valid, and its ``VALIDATE_INPUTS``. So when
every node keeps its class, its links and its input names, every class declares exactly what it declared last
time (``INPUT_TYPES()`` is still called for every class, every prompt: its choice lists follow the model folders),
and only constants changed, then only the changed constants are checked again (cast, bounds, choices) and the nodes
with ``VALIDATE_INPUTS`` (it may look at files) are validated again whole; the rest keeps last time's outcome.
Anything else, or any error among what is re-checked, takes the full validation, which words every error exactly
as ComfyUI does.

Constants count as changed unless equal and of the same type (``1``, ``1.0`` and ``True`` are equal in Python but
cast differently). Only a prompt that validated without any error is remembered. The memo is swapped whole, so a
server thread validating a queued prompt and the worker validating the one it runs never see half of it.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

from .definitions import NodeDefinitions
from .validation import InputValidator, ValidationResult, validate_prompt


@dataclass(frozen=True)
class _Validated:
    """A prompt that validated with no error: its nodes as sent, the declarations it met and the result."""

    nodes: dict  # node id -> (class_type, copy of its inputs as sent, the types of their values)
    targets: object  # the partial execution targets it was validated for
    declarations: dict  # class_type -> copy of INPUT_TYPES()
    result: ValidationResult
    definitions: NodeDefinitions  # what is read from those copies, lent to the runs whose classes declare the same


class ValidationMemo:
    def __init__(self):
        self._last: _Validated | None = None

    def validate(self, node_classes: dict, prompt, partial_execution_targets=None,
                 definitions: NodeDefinitions | None = None) -> ValidationResult:
        """``validate_prompt``'s result, re-checking only what needs it when the last prompt allows."""
        definitions = definitions if definitions is not None else NodeDefinitions(node_classes)
        last = self._last
        if last is not None:
            reused = _revalidated(last, prompt, partial_execution_targets, definitions)
            if reused is not None:
                return reused
        result = validate_prompt(node_classes, prompt, partial_execution_targets, definitions)
        self._last = _remembered(prompt, partial_execution_targets, definitions, result)
        return result


def _remembered(prompt, targets, definitions: NodeDefinitions, result: ValidationResult) -> _Validated | None:
    """Copies, so a caller editing its prompt dict (or a class mutating a declaration it returned) for the next
    prompt cannot edit what this one is compared with; None when there is nothing to remember."""
    if not result.ok or result.node_errors:
        return None
    try:
        nodes = {}
        for node_id, node in prompt.items():
            inputs = copy.deepcopy(node.get("inputs", {}))
            nodes[node_id] = (node["class_type"], inputs, tuple(map(type, inputs.values())))
        declarations = {class_type: copy.deepcopy(definitions.input_types(class_type))
                        for class_type in {class_type for class_type, _, _ in nodes.values()}}
        return _Validated(nodes, copy.deepcopy(targets), declarations, result,
                          NodeDefinitions(definitions.node_classes, declarations))
    except Exception:  # a declaration that cannot be copied: such prompts are always validated in full
        return None


def _revalidated(last: _Validated, prompt, targets, definitions: NodeDefinitions) -> ValidationResult | None:
    """The result for ``prompt`` from ``last`` and what was re-checked, or None when the full validation must
    run (a changed link, class, input name or declaration, or any error among what was re-checked)."""
    changed = _changed_constants(last, prompt)
    if changed is None or targets != last.targets:
        return None
    if not _declarations_unchanged(last, definitions):
        return None
    definitions.take_facts_of(last.definitions)
    casts = last.result.prompt
    fresh = {node_id: {**node, "inputs": dict(node["inputs"] if node_id in changed else casts[node_id]["inputs"])}
             for node_id, node in prompt.items()}
    validator = InputValidator(fresh, definitions)
    whole = [node_id for node_id, node in fresh.items()
             if hasattr(definitions.get_class(node["class_type"]), "VALIDATE_INPUTS")]
    validator.validated = {node_id: (True, []) for node_id in fresh if node_id not in whole}
    if not _rechecks_pass(validator, changed, whole):
        return None
    return ValidationResult(True, None, list(last.result.outputs), {}, fresh)


# Loops rather than any(...) in the two checks below: a generator costs a Python call per item, and they run on
# every rerun in CPU caches the last denoise has flushed.
def _declarations_unchanged(last: _Validated, definitions: NodeDefinitions) -> bool:
    """Whether every class of ``last`` declares now exactly what it declared then."""
    try:
        for class_type, declared in last.declarations.items():
            if definitions.input_types(class_type) != declared:
                return False
    except Exception:  # an INPUT_TYPES that raises now: the full validation reports it
        return False
    return True


def _rechecks_pass(validator: InputValidator, changed: dict, whole: list) -> bool:
    """Whether the changed constants of nodes without VALIDATE_INPUTS, and the nodes with it, all pass again."""
    try:
        for node_id, names in changed.items():
            if node_id not in whole and validator.check_constants(node_id, names):
                return False
        for node_id in whole:
            if validator.validate_with_upstream(node_id) != (True, []):
                return False
    except Exception:
        return False
    return True


def _changed_constants(last: _Validated, prompt) -> dict | None:
    """{node id: names of its constants that changed}; None when anything else changed (or is malformed)."""
    if not isinstance(prompt, dict) or prompt.keys() != last.nodes.keys():
        return None
    changed = {}
    for node_id, node in prompt.items():
        class_type, before, types = last.nodes[node_id]
        inputs = node.get("inputs", {}) if isinstance(node, dict) else None
        if not isinstance(inputs, dict) or node.get("class_type") != class_type or inputs.keys() != before.keys():
            return None
        if inputs == before and tuple(map(type, inputs.values())) == types:
            continue
        names = [name for name, value in inputs.items()
                 if type(value) is not type(before[name]) or value != before[name]]
        if any(isinstance(inputs[name], (list, dict)) or isinstance(before[name], (list, dict)) for name in names):
            return None  # a link (or a wrapped value) changed: the graph itself changed
        changed[node_id] = names
    return changed
