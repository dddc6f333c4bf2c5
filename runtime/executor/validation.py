"""Prompt validation with ComfyUI's error shapes (execution.py::validate_prompt / validate_inputs).

Clients (the ComfyUI frontend, scripts) read ``error`` and ``node_errors`` and show them per node, so the
``type``/``message``/``details``/``extra_info`` texts match ComfyUI's, including its aggregation quirks
(``dependent_outputs``; downstream nodes of a failing node are invalid but carry no errors of their own).
Deliberate differences, all stricter or clearer: ``"COMBO"``-typed inputs are checked against their
``options`` too (ComfyUI 2025-10 checks only list-typed combos); a static dependency cycle is reported as an
``exception_during_validation`` of type ``graph.DependencyCycleError`` instead of a RecursionError; a link to a
missing node or slot is a ``bad_linked_input`` instead of a KeyError; a non-string ``class_type`` or non-object
``inputs`` is an ``invalid_prompt`` naming the node instead of a crash; ``"*"`` accepts any linked type.
Constants are cast (INT/FLOAT/STRING/BOOLEAN) and ``{"__value__": [...]}`` unwrapped in the returned copy.
"""

from __future__ import annotations

import difflib
import math
import traceback
from dataclasses import dataclass, field
from typing import Any

from ...usecases.model_check import FILE_INPUTS, searched_text
from ...usecases.repository_models import repository_hint
from .. import folder_paths
from ..socket_types import combo_options, types_compatible
from .call_over_lists import gather_inputs, map_over_lists
from .definitions import CASTS, NodeDefinitions, accepted_arguments, full_type_name, is_link
from .graph import DependencyCycleError, find_cycle


@dataclass
class ValidationResult:
    """``ok``; ``error`` (ComfyUI's {type, message, details, extra_info}) when not ok; ``outputs`` = valid
    output node ids; ``node_errors`` = {node_id: {errors, dependent_outputs, class_type}}; ``prompt`` = the
    prompt with constants cast (what the executor runs)."""

    ok: bool
    error: dict | None = None
    outputs: list = field(default_factory=list)
    node_errors: dict = field(default_factory=dict)
    prompt: dict = field(default_factory=dict)


def _error(kind: str, message: str, details: str = "", extra_info: dict | None = None) -> dict:
    return {"type": kind, "message": message, "details": details, "extra_info": extra_info or {}}


def _unknown_class(node_classes: dict, node_id: str, class_type: str) -> dict:
    """ComfyUI's message and details, then what a user needs next: this runtime has no ComfyUI core nodes
    (KSampler, CheckpointLoaderSimple, ...), only the classes listed."""
    offered = sorted(node_classes)
    guess = closest_names(class_type, offered, count=1)
    did_you_mean = f" Did you mean '{guess[0]}'?" if guess else ""
    return _error(
        "invalid_prompt", f"Cannot execute because node {class_type} does not exist.",
        f"Node ID '#{node_id}'.{did_you_mean} This runtime offers only these nodes: {', '.join(offered)}. "
        "ComfyUI's core nodes "
        "(KSampler, CheckpointLoaderSimple, ...) are not available headless; run such a workflow inside ComfyUI.",
        {"node_id": node_id, "class_type": class_type, "available_node_types": offered})


def copy_prompt(prompt: dict) -> dict:
    """Copy the node dicts and their input dicts (values are shared) so casting never edits the caller's."""
    copied = {}
    for node_id, node in prompt.items():
        if isinstance(node, dict):
            node = dict(node)
            if isinstance(node.get("inputs"), dict):
                node["inputs"] = dict(node["inputs"])
        copied[str(node_id)] = node
    return copied


def validate_prompt(node_classes: dict, prompt: dict, partial_execution_targets=None,
                    definitions: NodeDefinitions | None = None) -> ValidationResult:
    """``definitions``: the run's memo of ``INPUT_TYPES()``, when the caller goes on to execute the prompt."""
    if not isinstance(prompt, dict):
        return ValidationResult(False, _error("invalid_prompt", "Prompt must be an object of nodes.", "", {}))
    prompt = copy_prompt(prompt)
    if definitions is None:
        definitions = NodeDefinitions(node_classes)
    outputs = []
    for node_id, node in prompt.items():
        if not isinstance(node, dict) or "class_type" not in node:
            return ValidationResult(False, _error(
                "invalid_prompt", "Cannot execute because a node is missing the class_type property.",
                f"Node ID '#{node_id}'"))
        class_type = node["class_type"]
        if not isinstance(class_type, str) or not isinstance(node.get("inputs", {}), dict):
            field_name = "class_type" if not isinstance(class_type, str) else "inputs"
            return ValidationResult(False, _error(
                "invalid_prompt", f"Cannot execute because a node's {field_name} property is malformed "
                "(class_type must be a string, inputs an object).", f"Node ID '#{node_id}'"))
        if definitions.get_class(class_type) is None:
            return ValidationResult(False, _unknown_class(node_classes, node_id, class_type))
        if definitions.is_output_node(class_type):
            if partial_execution_targets is None or node_id in partial_execution_targets:
                outputs.append(node_id)
    if not outputs:
        return ValidationResult(False, _error("prompt_no_outputs", "Prompt has no outputs"))

    validator = InputValidator(prompt, definitions)
    good_outputs, failed, node_errors = [], [], {}
    for output_id in outputs:
        ok, reasons = validator.validate_output(output_id)
        if ok:
            good_outputs.append(output_id)
            continue
        failed.append((output_id, reasons))
        for node_id, (node_ok, node_reasons) in validator.validated.items():
            if node_ok or not node_reasons:
                continue  # downstream of an error: invalid, but ComfyUI attaches no errors to it
            if node_id not in node_errors:
                node_errors[node_id] = {"errors": node_reasons, "dependent_outputs": [],
                                        "class_type": prompt[node_id]["class_type"]}
            node_errors[node_id]["dependent_outputs"].append(output_id)

    if not good_outputs:
        details = "\n".join(f"{r['message']}: {r['details']}" for _, reasons in failed for r in reasons)
        return ValidationResult(False, _error("prompt_outputs_failed_validation", "Prompt outputs failed validation",
                                              details), [], node_errors, prompt)
    return ValidationResult(True, None, good_outputs, node_errors, prompt)


class InputValidator:
    """Validates nodes upstream from each output, memoising ``validated[node_id] = (ok, errors)``."""

    def __init__(self, prompt: dict, definitions: NodeDefinitions):
        self.prompt = prompt
        self.definitions = definitions
        self.validated: dict[str, tuple[bool, list]] = {}
        # Upstream nodes whose INPUT_TYPES/VALIDATE_INPUTS raised, until the node linking to them reports it.
        self.raised: dict[str, BaseException] = {}
        self._upstream: dict[str, list[str]] = {}

    def validate_output(self, output_id: str) -> tuple[bool, list]:
        cycle = find_cycle(self.prompt, [output_id])
        if cycle is not None:
            reason = _error("exception_during_validation", "Exception when validating node",
                            f"Dependency cycle detected: {' -> '.join(cycle)}",
                            {"exception_type": DependencyCycleError.exception_type_name, "traceback": []})
            for node_id in cycle[:-1]:
                self.validated[node_id] = (False, [reason])
            self.validated.setdefault(output_id, (False, [reason] if output_id in cycle else []))
            return False, self.validated[output_id][1]
        try:
            return self.validate_with_upstream(output_id)
        except Exception as exc:  # a node's INPUT_TYPES/VALIDATE_INPUTS raised: ComfyUI reports it this way
            reason = _error("exception_during_validation", "Exception when validating node", str(exc),
                            {"exception_type": full_type_name(type(exc)),
                             "traceback": traceback.format_tb(exc.__traceback__)})
            self.validated[output_id] = (False, [reason])
            return False, [reason]

    def validate_with_upstream(self, node_id: str) -> tuple[bool, list]:
        """Post-order walk (explicit stack: no recursion limit on long chains; cycles were excluded)."""
        stack = [node_id]
        while stack:
            current = stack[-1]
            if current in self.validated:
                stack.pop()
                continue
            try:
                pending = [up for up in self._upstream_ids(current) if up not in self.validated]
                if pending:
                    stack.extend(pending)
                    continue
                self.validated[current] = self._validate_node(current)
            except Exception as exc:
                if current == node_id:
                    raise  # the output itself: exception_during_validation (validate_output)
                # ComfyUI reports an upstream node's exception through the node that links to it, as an
                # exception_during_inner_validation error filed under the raising node (see _inner_error).
                self.raised[current] = exc
                self.validated[current] = (False, [])
            stack.pop()
        return self.validated[node_id]

    def _inner_error(self, name: str, value: list, config: list) -> None:
        """File the exception of the upstream node ``value[0]`` under that node, as ComfyUI does."""
        exc = self.raised.pop(value[0])
        reason = _error("exception_during_inner_validation", "Exception when validating inner node", str(exc),
                        {"input_name": name, "input_config": config, "exception_message": str(exc),
                         "exception_type": full_type_name(type(exc)),
                         "traceback": traceback.format_tb(exc.__traceback__), "linked_node": value})
        self.validated[value[0]] = (False, [reason])

    def _upstream_ids(self, node_id: str) -> list[str]:
        """Linked nodes on declared inputs; asked twice per node by the walk (before and after its upstream nodes),
        read once (only a node's own validation casts its inputs, after both)."""
        ids = self._upstream.get(node_id)
        if ids is None:
            ids = self._upstream[node_id] = self._read_upstream_ids(node_id)
        return ids

    def _read_upstream_ids(self, node_id: str) -> list[str]:
        node = self.prompt[node_id]
        class_type = node["class_type"]
        ids = []
        for name in self.definitions.declared_inputs(class_type):
            value = (node.get("inputs") or {}).get(name)
            if isinstance(value, list) and len(value) == 2 and value[0] in self.prompt:
                ids.append(value[0])
        return ids

    def _validate_node(self, node_id: str) -> tuple[bool, list]:
        node = self.prompt[node_id]
        inputs = node.setdefault("inputs", {})
        class_type = node["class_type"]
        node_class = self.definitions.get_class(class_type)
        validate_fn = getattr(node_class, "VALIDATE_INPUTS", None)
        fn_args, fn_kwargs = accepted_arguments(validate_fn) if validate_fn is not None else (set(), False)
        errors: list[dict] = []
        valid = True
        received_types: dict[str, Any] = {}

        infos = self.definitions.input_infos(class_type)
        for name in self.definitions.declared_inputs(class_type):
            input_type, category, extra_info = infos[name]
            if name not in inputs:
                if category == "required":
                    errors.append(_error("required_input_missing", "Required input is missing", name,
                                         {"input_name": name}))
                continue
            value = inputs[name]
            if isinstance(value, list):
                config = [input_type, extra_info]
                link_error = self._check_link(name, value, config)
                if link_error is not None:
                    errors.append(link_error)
                    continue
                received = self.definitions.return_types(self.prompt[value[0]]["class_type"])[int(value[1])]
                received_types[name] = received
                if "input_types" not in fn_args and not types_compatible(received, input_type):
                    errors.append(_error(
                        "return_type_mismatch", "Return type mismatch between linked nodes",
                        f"{name}, received_type({received}) mismatch input_type({input_type})",
                        {"input_name": name, "input_config": config, "received_type": received,
                         "linked_node": value}))
                    continue
                if value[0] in self.raised:
                    self._inner_error(name, value, config)
                if not self.validated[value[0]][0]:
                    valid = False
                continue
            constant_error = self._check_constant(inputs, name, input_type, extra_info,
                                                  checks_bounds=name not in fn_args and not fn_kwargs)
            if constant_error is not None:
                errors.append(constant_error)

        errors.extend(self._undeclared_links(node_class, class_type, inputs))
        if validate_fn is not None and (fn_args or fn_kwargs):
            errors.extend(self._custom_validation(node_id, node, node_class, fn_args, fn_kwargs, received_types))
        return (not errors and valid), errors

    def _undeclared_links(self, node_class, class_type: str, inputs: dict) -> list[dict]:
        """ComfyUI 0.3.64 validates declared inputs only, drops undeclared constants and passes undeclared links
        to the node's function (variadic nodes take them as **kwargs): a link its function cannot take failed
        there at run time with a TypeError. Refused here instead, naming the input; constants are still dropped."""
        declared = self.definitions.declared_inputs(class_type)
        names = [name for name, value in inputs.items() if name not in declared and is_link(value)]
        function = getattr(node_class, str(getattr(node_class, "FUNCTION", "")), None)
        if not names or function is None:
            return []
        parameters, takes_any = accepted_arguments(function)
        return [_error("undeclared_input", "Input is not declared by the node",
                       f"{name}: {class_type} has no input {name!r} (its inputs: {', '.join(declared)})",
                       {"input_name": name, "received_value": inputs[name]})
                for name in names if not takes_any and name not in parameters]

    def check_constants(self, node_id: str, names) -> list[dict]:
        """The errors of these constant inputs of a node without ``VALIDATE_INPUTS``, each cast in place, exactly
        as ``_validate_node`` finds them (the validation memo re-checks a rerun's changed constants this way)."""
        node = self.prompt[node_id]
        class_type = node["class_type"]
        errors = []
        for name in names:
            input_type, category, extra_info = self.definitions.input_info(class_type, name)
            if category not in ("required", "optional"):
                continue  # not a declared input: passed on as sent, never checked
            error = self._check_constant(node["inputs"], name, input_type, extra_info, checks_bounds=True)
            if error is not None:
                errors.append(error)
        return errors

    def _check_link(self, name: str, value: list, config: list) -> dict | None:
        problem = None
        if len(value) != 2:
            return _error("bad_linked_input", "Bad linked input, must be a length-2 list of [node_id, slot_index]",
                          name, {"input_name": name, "input_config": config, "received_value": value})
        from_id, slot = value
        if not isinstance(from_id, str):
            problem = f"{name}, linked node id {from_id!r} must be a string (prompt node ids are strings)"
        elif from_id not in self.prompt:
            problem = f"{name}, linked node '{from_id}' does not exist in the prompt"
        elif not isinstance(slot, int) or isinstance(slot, bool) or not (
            0 <= slot < len(self.definitions.return_types(self.prompt[from_id]["class_type"]))
        ):
            problem = f"{name}, linked node '{from_id}' has no output slot {slot}"
        if problem is None:
            return None
        return _error("bad_linked_input", "Bad linked input, must be a length-2 list of [node_id, slot_index]",
                      problem, {"input_name": name, "input_config": config, "received_value": value})

    @staticmethod
    def _check_constant(inputs, name, input_type, extra_info, *, checks_bounds) -> dict | None:
        """Cast (and unwrap) the constant in place; its first problem as ComfyUI's error, else None. The error's
        ``input_config`` list is built only for an error: most constants pass."""
        value = inputs[name]
        try:
            if isinstance(value, dict) and "__value__" in value:
                value = value["__value__"]
                inputs[name] = value
            cast = CASTS.get(input_type) if isinstance(input_type, str) else None
            if cast is not None:
                value = cast(value)
                inputs[name] = value
        except Exception as exc:
            return _error("invalid_input_type", f"Failed to convert an input value to a {input_type} value",
                          f"{name}, {value}, {exc}",
                          {"input_name": name, "input_config": [input_type, extra_info], "received_value": value,
                           "exception_message": str(exc)})
        if not checks_bounds:
            return None
        if ("min" in extra_info or "max" in extra_info) and isinstance(value, float) and math.isnan(value):
            # NaN compares false with both bounds, so it passed them (ComfyUI's own check lets it through too)
            return _error("value_not_a_number", f"Value {value} is not a number between {extra_info.get('min')} and "
                          f"{extra_info.get('max')}", name,
                          {"input_name": name, "input_config": [input_type, extra_info], "received_value": None})
        if "min" in extra_info and value < extra_info["min"]:
            return _error("value_smaller_than_min", f"Value {value} smaller than min of {extra_info['min']}", name,
                          {"input_name": name, "input_config": [input_type, extra_info], "received_value": value})
        if "max" in extra_info and value > extra_info["max"]:
            return _error("value_bigger_than_max", f"Value {value} bigger than max of {extra_info['max']}", name,
                          {"input_name": name, "input_config": [input_type, extra_info], "received_value": value})
        options = combo_options(input_type, extra_info)
        if options is not None and value not in options:
            config = None if len(options) > 20 else [input_type, extra_info]  # ComfyUI does not echo huge lists
            return _error("value_not_in_list", "Value not in list", _not_in_list_details(name, value, options),
                          {"input_name": name, "input_config": config, "received_value": value})
        return None

    def _custom_validation(self, node_id, node, node_class, fn_args, fn_kwargs, received_types) -> list[dict]:
        """VALIDATE_INPUTS on the class: linked inputs arrive as None; one error per passed input on failure."""
        values, _ = gather_inputs(node_id, node, self.definitions, None)
        passed = {name: v for name, v in values.items() if fn_kwargs or name in fn_args}
        if "input_types" in fn_args:
            passed["input_types"] = [received_types]
        returns = map_over_lists(node_class, "VALIDATE_INPUTS", passed,
                                 input_is_list=bool(getattr(node_class, "INPUT_IS_LIST", False)))
        errors = []
        for name in passed:
            for returned in returns:
                if returned is True:
                    continue
                details = name if returned is False else f"{name} - {returned}"
                errors.append(_error("custom_validation_failed", "Custom validation failed for node", details,
                                     {"input_name": name}))
        return errors


def closest_names(wanted: Any, choices, count: int = 3) -> list:
    """The ``count`` choices nearest to ``wanted`` by spelling, case-blind (``WanMoELoraPair`` finds
    ``WanMoELoRAPair``): a typo costs a newcomer minutes when the error only lists everything there is."""
    if not isinstance(wanted, str):
        return []
    by_folded = {}
    for choice in choices:
        if isinstance(choice, str):
            by_folded.setdefault(choice.casefold(), choice)
    found = difflib.get_close_matches(wanted.casefold(), list(by_folded), n=count, cutoff=0.5)
    return [by_folded[folded] for folded in found]


SHORT_LIST = 5  # a combo list this short is shown whole (a mode's choices); a longer one by its closest names


def _not_in_list_details(name: str, value: Any, options) -> str:
    """"mode: 'pow' not in ['add', 'mul']" for a short list; for a longer one (the scanned LoRA and model files)
    the three closest names first, then how many there are and where they were looked for: a typo used to print
    all 19 fixture names before the one the user meant."""
    searched = _searched_folders(name, value)
    if len(options) <= SHORT_LIST:
        return f"{name}: '{value}' not in {options}{searched}"
    near = closest_names(value, options)
    if not near:
        return f"{name}: '{value}' not found (none of the {len(options)} choices is close){searched}"
    return (f"{name}: '{value}' not found; closest: {', '.join(repr(n) for n in near)} "
            f"(of {len(options)} choices){searched}")


def _searched_folders(input_name: str, value) -> str:
    """"; searched models/diffusion_models, models/unet" for an input that names a model file (issue 26: a missing
    model said "Value not in list" without saying where it was looked for). Relative to the models root: the
    browser sees this message. A loader's repository id also names the command that gets its files (issue 55)."""
    kind = FILE_INPUTS.get(input_name)
    if kind is None:
        return ""
    return f"; {searched_text(folder_paths, kind, models_root=folder_paths.models_dir)}{repository_hint(kind, value)}"
