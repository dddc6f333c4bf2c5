"""Several requests' forward inputs as one batch, and the batch's output back as each request's rows.

Everything here follows the family's ``BatchRule``: rows are concatenated along dimension 0, per-sample lists
joined, shared inputs passed once, and text a rule marks as padded is padded with zeros to the longest, its mask
with 0 (the attention then skips the padding). A call whose inputs the rule does not cover has no signature and
runs alone.
"""

from __future__ import annotations

from typing import Optional

import torch

from ..generation.batch_rules import BatchRule


def rows_of(rule: BatchRule, inputs: dict) -> Optional[int]:
    """How many samples a call holds (its row tensors' first dimension), None when they disagree or it has none."""
    counts = {int(inputs[name].shape[0]) for name in rule.rows
              if isinstance(inputs.get(name), torch.Tensor) and inputs[name].dim() > 0}
    return counts.pop() if len(counts) == 1 else None


def signature(rule: BatchRule, inputs: dict) -> Optional[tuple]:
    """What calls must share to stack (shapes past the batch dimension, dtypes, devices, shared values); None when
    the call cannot stack at all (an input the rule does not name, rows that disagree)."""
    if not set(inputs) <= rule.names() or rows_of(rule, inputs) is None:
        return None
    parts = []
    for name in sorted(inputs):
        value = inputs[name]
        if name in rule.lists or value is None:
            parts.append((name, value is None))
        elif name in rule.rows:
            if not isinstance(value, torch.Tensor):
                return None
            pads = (name in rule.padded and rule.padded[name] in inputs) or name in _masks(rule)
            shape = tuple(value.shape[2:] if pads else value.shape[1:])  # no mask input: lengths must agree
            parts.append((name, shape, value.dtype, value.device))
        elif isinstance(value, torch.Tensor):  # shared: compared by value when calls meet (``same_shared``)
            parts.append((name, tuple(value.shape), value.dtype, value.device))
        else:
            parts.append((name, repr(value)))
    return tuple(parts)


def same_shared(rule: BatchRule, first: dict, other: dict) -> bool:
    """Whether two calls of one signature give equal shared tensors (their other shared values are in the
    signature already)."""
    return all(torch.equal(first[name], other[name]) for name in rule.shared
               if isinstance(first.get(name), torch.Tensor))


def stack(rule: BatchRule, calls: list) -> tuple:
    """(the batch's inputs, each call's row count) for calls of one signature."""
    counts = [rows_of(rule, inputs) for inputs in calls]
    first = calls[0]
    stacked = {}
    for name, value in first.items():
        if value is None or name in rule.shared:
            stacked[name] = value
        elif name in rule.lists:
            stacked[name] = [entry for inputs in calls for entry in inputs[name]]
        elif name not in rule.padded and name not in _masks(rule):
            stacked[name] = torch.cat([inputs[name] for inputs in calls], dim=0)
    for name, mask_name in rule.padded.items():
        if name in first and first[name] is not None:
            stacked[name], mask = _padded(calls, counts, name, mask_name)
            if mask_name in first:
                stacked[mask_name] = mask
    return stacked, counts


def split(output, counts: list) -> list:
    """The batch's output (a tensor, or a tuple/list of tensors with the batch first) as one output per call."""
    if isinstance(output, torch.Tensor):
        return list(torch.split(output, counts, dim=0))
    parts = [split(item, counts) if isinstance(item, torch.Tensor) else [item] * len(counts) for item in output]
    return [type(output)(part[index] for part in parts) for index in range(len(counts))]


def _masks(rule: BatchRule) -> set:
    return set(rule.padded.values())


def _padded(calls: list, counts: list, name: str, mask_name: str) -> tuple:
    """One padded row tensor ``name`` [rows, longest, ...] and its mask [rows, longest] (None when every call
    gave the same length and no mask)."""
    lengths = [int(inputs[name].shape[1]) for inputs in calls]
    longest = max(lengths)
    masks = [inputs.get(mask_name) for inputs in calls]
    if len(set(lengths)) == 1 and all(mask is None for mask in masks):
        return torch.cat([inputs[name] for inputs in calls], dim=0), None
    dtype = next((mask.dtype for mask in masks if mask is not None), torch.long)
    values, padded_masks = [], []
    for inputs, rows, length, mask in zip(calls, counts, lengths, masks):
        value = inputs[name]
        if mask is None:
            mask = torch.ones(rows, length, dtype=dtype, device=value.device)
        values.append(torch.nn.functional.pad(value, (0, 0) * (value.dim() - 2) + (0, longest - length)))
        padded_masks.append(torch.nn.functional.pad(mask, (0, longest - length)))
    return torch.cat(values, dim=0), torch.cat(padded_masks, dim=0)
