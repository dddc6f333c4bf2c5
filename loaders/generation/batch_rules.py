"""How a family's denoiser forward inputs stack along the batch dimension, so that the step engine
(``loaders.batching``) can run several requests' forwards as one.

Why each family declares it: only the family knows which of its forward's inputs carry one row per sample
(latents, timesteps, text), which are one value for the whole call (a flag, a rotary table) and which text may be
padded because its attention takes a mask. The engine stacks nothing it was not told about: an input a rule does
not name makes that call run alone, which is always correct.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class BatchRule:
    """``rows``: tensors whose first dimension is the batch (concatenated); ``lists``: Python lists with one entry
    per sample (concatenated); ``shared``: inputs every call of a batch must give equal (passed once);
    ``padded``: a row tensor whose second dimension (text tokens) may differ between calls -> the name of its
    mask input (a row tensor, 1 = a real token): shorter ones are padded with zeros and their mask with 0, so the
    attention skips the padding. A row tensor not in ``padded`` must have the same shape in every call."""

    rows: frozenset
    lists: frozenset = frozenset()
    shared: frozenset = frozenset()
    padded: dict = field(default_factory=dict)

    def names(self) -> frozenset:
        return self.rows | self.lists | self.shared


@dataclass(frozen=True)
class NoBatching:
    """A family whose forwards cannot share a batch; ``reason`` says why (the engine reports it)."""

    reason: str
