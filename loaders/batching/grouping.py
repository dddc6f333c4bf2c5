"""Which waiting forwards run together next, and under which fused base.

The rules, in order:

1. Forwards share a batch only when they are made for one model and one denoiser (the same Wan2.2 expert at this
   step), stack under the family's rule (same shapes past the batch, equal shared inputs) and belong to one
   binding group (``bindings``: the same specs that cannot run per row).
2. A forward passed over ``limit`` times (a batch ran while it waited) goes next, whatever the cost: no request
   waits forever, and the bound is ``limit`` batches, plus at most one re-bind.
3. Otherwise the engine prefers a batch that needs no re-bind (its group's base is what the model holds now),
   then one on the denoiser it ran last (no expert swap under a swap memory plan), then the largest, then the
   oldest.

A group's base is the specs every one of its requests in flight has; it is kept while it stays a part of every
member's binding ("sticky"), so a request joining or leaving a batch re-binds nothing unless it lacks what is
fused now. With ``max_batch`` 1 every request is its own group and its base is its whole binding: exactly the
bind of a run on its own.
"""

from __future__ import annotations

from .stacking import same_shared


class Groups:
    """The binding groups of the requests in flight, and each group's base (a frozenset of spec keys)."""

    def __init__(self, row_forms, max_batch: int):
        self.row_forms, self.max_batch = row_forms, max_batch
        self._bases: dict = {}

    def key_of(self, request) -> tuple:
        binding = request.binding
        if self.max_batch == 1 or binding.exclusive:
            return ("alone", request.number)
        return id(request.model), self.row_forms.fixed_keys(request.model, binding)

    def base_of(self, group, members: list) -> frozenset:
        """The specs fused (or activated) for every row of ``group``'s batches; ``members``: its requests in
        flight (at least the batch's)."""
        if group[0] == "alone":
            return frozenset(members[0].binding.keys)
        sticky = self._bases.get(group)
        if sticky is None or not all(sticky <= set(m.binding.keys) for m in members):
            sticky = frozenset.intersection(*(frozenset(m.binding.keys) for m in members))
            self._bases[group] = sticky
        return sticky

    def forget_unused(self, groups_in_flight: set) -> None:
        for group in [g for g in self._bases if g not in groups_in_flight]:
            del self._bases[group]


def can_join(seed, other) -> bool:
    """Whether ``other`` may run in one forward with ``seed``."""
    return (other.request.model is seed.request.model and other.component == seed.component
            and other.request.group == seed.request.group and seed.signature is not None
            and other.signature == seed.signature and same_shared(seed.rule, seed.inputs, other.inputs))


def choose_batch(pending: list, max_batch: int, limit: int, last_component, needs_rebind) -> list:
    """The next batch out of the waiting forwards (oldest first in ``pending``); ``needs_rebind(call)``: whether
    running ``call``'s group means binding other weights first."""
    starving = [call for call in pending if call.passed_over >= limit]
    seeds = starving[:1] or pending
    best, best_score = None, None
    for seed in seeds:
        batch = [seed] + [call for call in pending if call is not seed and can_join(seed, call)][:max_batch - 1]
        score = (not needs_rebind(seed), seed.component == last_component, len(batch), -seed.number)
        if best_score is None or score > best_score:
            best, best_score = batch, score
    return best
