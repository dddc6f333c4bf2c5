"""Calling node methods with ComfyUI's list semantics, and shaping what they return.

Every value in the runtime is a list: a constant is ``[value]``, a link resolves to the upstream slot's list.
Without ``INPUT_IS_LIST`` a method is called once per index up to the longest input (shorter lists repeat their
last item); with it, once with every argument a list. Results are merged per output slot, concatenated where
``OUTPUT_IS_LIST``. (ComfyUI's execution.py: get_input_data, _async_map_node_over_list, merge_result_data,
get_output_from_returns.)
"""

from __future__ import annotations

import asyncio
import inspect
from typing import Any, Callable

from .definitions import NodeDefinitions, is_link


def gather_inputs(
    node_id: str,
    node: dict,
    definitions: NodeDefinitions,
    outputs_of: Callable[[str], list | None] | None,
    *,
    prompt: dict | None = None,
    extra_data: dict | None = None,
) -> tuple[dict[str, list], set[str]]:
    """(input name -> list of values, names of links whose upstream output is not available).

    ``outputs_of(node_id)`` returns that node's outputs (list of slot lists) or None; None for ``outputs_of``
    itself means "no outputs at all" (IS_CHANGED / VALIDATE_INPUTS see linked inputs as None). Links into
    undeclared names are passed (variadic nodes rely on it); undeclared constants are dropped.
    """
    class_type = node["class_type"]
    values: dict[str, list] = {}
    missing: set[str] = set()
    infos = definitions.input_infos(class_type)
    for name, value in (node.get("inputs") or {}).items():
        _, category, extra = infos[name]
        if isinstance(value, list) and is_link(value) and not (extra and extra.get("rawLink", False)):
            upstream = outputs_of(value[0]) if outputs_of is not None else None
            slot = int(value[1])
            if upstream is None or slot >= len(upstream):
                missing.add(name)
                values[name] = [None]
            else:
                values[name] = upstream[slot]
        elif category is not None:
            values[name] = [value]
    hidden = definitions.hidden_inputs(class_type)
    if hidden:
        values.update(_hidden_values(hidden, node_id, prompt, extra_data or {}))
    return values, missing


def _hidden_values(hidden: dict, node_id: str, prompt: dict | None, extra_data: dict) -> dict[str, list]:
    """The values of a node's hidden inputs (kinds this runtime does not know are left out)."""
    known = {
        "PROMPT": prompt if prompt is not None else {},
        "DYNPROMPT": prompt,  # ComfyUI passes its DynamicPrompt; we have no expansion, so the prompt
        "EXTRA_PNGINFO": extra_data.get("extra_pnginfo"),
        "UNIQUE_ID": node_id,
        "AUTH_TOKEN_COMFY_ORG": extra_data.get("auth_token_comfy_org"),
        "API_KEY_COMFY_ORG": extra_data.get("api_key_comfy_org"),
    }
    return {name: [known[kind]] for name, kind in hidden.items() if kind in known}


# What node methods return almost always: never awaitable, told apart by type alone. inspect.isawaitable goes
# through the Awaitable ABC, which is slow right after a node's torch work has flushed the CPU caches.
_NEVER_AWAITABLE = frozenset({tuple, dict, list, str, bool, int, float, type(None)})


def _is_awaitable(result: Any) -> bool:
    """Node functions may be ``async def``: ``map_over_lists`` then runs the coroutine to completion. The executor
    runs on a worker thread (server) or the main thread (CLI), never inside a running event loop."""
    return type(result) not in _NEVER_AWAITABLE and inspect.isawaitable(result)


async def _await(awaitable):
    return await awaitable


def map_over_lists(
    target: Any,
    function_name: str,
    inputs: dict[str, list],
    *,
    input_is_list: bool,
    before_call: Callable[[], None] | None = None,
) -> list:
    """Call ``target.<function_name>`` once per list index (or once with lists); return every call's result."""
    function = getattr(target, function_name)

    def call(kwargs: dict) -> Any:
        if before_call is not None:
            before_call()
        result = function(**kwargs)
        return asyncio.run(_await(result)) if _is_awaitable(result) else result

    if input_is_list:
        return [call(inputs)]
    if not inputs:
        return [call({})]
    longest = max(map(len, inputs.values()))
    if longest == 1:  # one call, as almost always (a constant or one upstream value per input)
        return [call({name: values[0] for name, values in inputs.items()})]
    return [
        call({name: values[i if len(values) > i else -1] for name, values in inputs.items()})
        for i in range(longest)
    ]


def shape_returns(returns: list, node_class, node_id: str, class_type: str) -> tuple[list, dict]:
    """(outputs as per-slot lists, merged ui dict) from a node's per-call return values.

    Accepts a tuple/list of outputs, ``{"result": ..., "ui": ...}``, or ``{"ui": ...}``. Node expansion
    (``"expand"``) is not supported by this runtime: it is reported as an error naming the node.
    """
    return_types = tuple(getattr(node_class, "RETURN_TYPES", ()))
    results: list[tuple] = []
    uis: list[dict] = []
    for returned in returns:
        if isinstance(returned, dict):
            if "expand" in returned:
                raise NotImplementedError(
                    f"Node {node_id} ({class_type}) returned a graph expansion ('expand'), which the lorabind "
                    "headless runtime does not support."
                )
            if returned.get("ui") is not None:
                uis.append(returned["ui"])
            if "result" in returned:
                results.append(_check_result(returned["result"], return_types, node_id, class_type))
        elif returned is None and not return_types:
            continue
        else:
            results.append(_check_result(returned, return_types, node_id, class_type))
    outputs = _merge_results(results, getattr(node_class, "OUTPUT_IS_LIST", None)) if results else []
    ui: dict = {}
    if uis:
        ui = {key: [item for part in uis for item in part.get(key, [])] for key in uis[0]}
    return outputs, ui


def _check_result(result: Any, return_types: tuple, node_id: str, class_type: str) -> tuple:
    if not isinstance(result, (tuple, list)) or len(result) != len(return_types):
        raise TypeError(
            f"Node {node_id} ({class_type}) must return a tuple of {len(return_types)} value(s) matching "
            f"RETURN_TYPES {list(return_types)}, got {type(result).__name__}"
            + (f" of length {len(result)}" if isinstance(result, (tuple, list)) else "")
        )
    return tuple(result)


def _merge_results(results: list[tuple], output_is_list) -> list[list]:
    if len(results) == 1 and not output_is_list:  # one call, as almost always: each slot holds its one value
        return [[value] for value in results[0]]
    slot_count = len(results[0])
    is_list = list(output_is_list) if output_is_list else [False] * slot_count
    merged = []
    for slot in range(slot_count):
        if slot < len(is_list) and is_list[slot]:
            merged.append([item for result in results for item in result[slot]])
        else:
            merged.append([result[slot] for result in results])
    return merged


def format_value(value: Any) -> Any:
    """JSON-safe copy of an input value for ``current_inputs`` (ComfyUI keeps primitives, str() the rest)."""
    if value is None or isinstance(value, (int, float, bool, str)):
        return value
    return str(value)
