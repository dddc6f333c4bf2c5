"""The one protocol between the step engines of a parallel job's ranks: rank 0's engine decides every forward (which
requests' forwards, under which fused base) and every departure (an interrupt, a failure), and the other ranks'
engines run exactly that, in that order.

Why: each rank runs the same prompts on its own threads (SPMD), and each batched forward holds collectives (the
sequence split's all-to-all, tensor parallelism's all-reduce) that every rank must enter with the same batch. A
follower therefore never chooses: it waits for rank 0's plan, then for its own requests to reach the forwards
the plan names, and runs them. An interrupt or a failure on rank 0 is a plan too, so every rank stops that
request at the same forward; the other requests go on, on every rank.

A request is known across ranks by its key (the prompt id, the sampler node, and how many samplers of that node
ran before in the prompt) and a forward by its index in the request (0, 1, ...). A plan names the fused base by
positions in the lead request's binding (its fuses, then its adapters), which every rank holds alike.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Protocol

LEFT_INTERRUPTED = "interrupted"


class PlanStream(Protocol):
    """Where plans go: rank 0 publishes, every other rank receives them in order (JSON-able dicts)."""

    def publish(self, plan: dict) -> None: ...

    def receive(self, timeout_s: float) -> Optional[dict]:
        """The next plan, or None when none came within ``timeout_s`` (rank 0 gone or stalled)."""


@dataclass(frozen=True)
class Chosen:
    """One forward's batch: the waiting forwards (``PendingForward``), the base's spec keys, and whether each
    member's whole binding is bound (a forward that stacks with nothing, or a retry on its own)."""

    calls: list
    base: frozenset
    whole: bool = False


def batch_plan(chosen: Chosen) -> dict:
    lead = chosen.calls[0].request.binding
    specs = [*lead.fuses, *lead.adapters]
    return {"batch": [[call.request.key, call.index] for call in chosen.calls],
            "base": [i for i, spec in enumerate(specs) if _key_of(lead, spec) in chosen.base],
            "whole": chosen.whole}


def base_keys(binding, positions: list) -> frozenset:
    """The spec keys at ``positions`` of ``binding`` (the lead request's, on a follower)."""
    specs = [*binding.fuses, *binding.adapters]
    return frozenset(_key_of(binding, specs[i]) for i in positions)


def left_plan(key, why: str) -> dict:
    """A request left rank 0 before its next forward: ``why`` is ``LEFT_INTERRUPTED`` or its error's text."""
    return {"left": key, "why": why}


def _key_of(binding, spec) -> tuple:
    return next(key for key, held in binding.keys.items() if held is spec)
