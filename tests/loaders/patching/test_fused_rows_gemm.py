"""The one-gemm fuse (issue 33): a bfloat16 weight with one bfloat16 low-rank pair is written by one gemm in
bfloat16 (float32 accumulation, one rounding) instead of float32 row chunks — as exact as the row path, which
every other case still takes."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from lorabind.loaders.binding import fused_rows
from lorabind.loaders.binding.patching import PatchLayer, WeightPatcher
from lorabind.loaders.lora.canonical import TargetPatch
from lorabind.loaders.lora.finite_bounds import rounding_growth
from lorabind.loaders.lora.kinds.low_rank import LowRankDelta

ONE_GEMM = fused_rows.has_onednn_bf16_gemm()
ROWS, COLS, RANK = 384, 256, 32  # large enough for oneDNN's gemm (m·n·k above torch's 16³ cut-off)


def _pair(seed: int, dtype=torch.bfloat16, scale: float = 0.5) -> LowRankDelta:
    g = torch.Generator().manual_seed(seed)
    return LowRankDelta(down=(torch.randn(RANK, COLS, generator=g) * 0.05).to(dtype),
                        up=(torch.randn(ROWS, RANK, generator=g) * 0.05).to(dtype), alpha=None, scale=scale)


def _weight(seed: int = 0) -> torch.Tensor:
    return (torch.randn(ROWS, COLS, generator=torch.Generator().manual_seed(seed)) * 0.02).to(torch.bfloat16)


def _contribution(*deltas, strength: float = 0.8) -> SimpleNamespace:
    """What ``write_patched`` reads of one layer's contribution: its strength and its kinds' deltas."""
    return SimpleNamespace(strength=strength, deltas=tuple(deltas))


def _assert_rounded_once(value: torch.Tensor, weight: torch.Tensor, strength: float, *deltas) -> None:
    """``value`` is the exact sum rounded once, up to float32 accumulation: every element within half a bfloat16
    spacing (2⁻⁸ relative) of the float32 result, itself within γ · Σ|terms| of the exact sum; and fewer than 1 in
    1,000 elements differ from the exact sum rounded to bfloat16 (rounding the delta to bfloat16 before adding it
    moves about 18% of them)."""
    exact, terms = weight.double(), weight.double().abs()
    for delta in deltas:
        factor = strength * delta.scale
        exact = exact + factor * (delta.up.double() @ delta.down.double())
        terms = terms + abs(factor) * (delta.up.double().abs() @ delta.down.double().abs())
    accumulation = (rounding_growth(RANK * len(deltas) + 2) - 1.0) * terms
    allowed = 2.0 ** -8 * (exact.abs() + accumulation) + accumulation
    assert bool(((value.double() - exact).abs() <= allowed).all())
    assert int((value != exact.to(torch.bfloat16)).sum()) < value.numel() // 1000


def _written(weight: torch.Tensor, contributions, **kwargs) -> tuple:
    """(written value, whether the float32 row buffer was used)."""
    dest = weight.clone()
    workspace = fused_rows.Workspace()
    fused_rows.write_patched(dest, weight, contributions, workspace, **kwargs)
    return dest, bool(workspace._buffers)


def test_one_pair_in_bfloat16_is_one_gemm_and_as_exact_as_the_float32_rows():
    """Both paths are the exact sum rounded once (up to float32 accumulation); only the gemm path leaves the
    float32 row buffer unused (on a CPU without oneDNN's bfloat16 gemm both use it)."""
    weight, delta = _weight(), _pair(1)
    gemm, used_rows = _written(weight, [_contribution(delta)])
    rows_delta = LowRankDelta(down=delta.down.float(), up=delta.up.float(), alpha=None, scale=delta.scale)
    rows, rows_used_rows = _written(weight, [_contribution(rows_delta)])
    assert used_rows is not ONE_GEMM and rows_used_rows  # float32 factors always take the row path
    for value in (gemm, rows):
        _assert_rounded_once(value, weight, 0.8, delta)


def test_the_gemm_overwrites_a_previous_value_unless_told_the_weight_is_the_original():
    """A re-fuse (switch) copies the original back first: same bits as a first fuse into the original."""
    weight, delta = _weight(), _pair(2)
    first, _ = _written(weight, [_contribution(delta)], dest_holds_original=True)
    dest = weight.clone()
    fused_rows.write_patched(dest, weight, [_contribution(_pair(3))])
    fused_rows.write_patched(dest, weight, [_contribution(delta)])
    assert torch.equal(dest, first)
    _assert_rounded_once(first, weight, 0.8, delta)


def test_two_pairs_on_one_weight_take_the_row_path_and_round_once():
    """Two terms would round twice in two gemms: the rows add both in float32 and round once."""
    weight, a, b = _weight(), _pair(4), _pair(5)
    value, used_rows = _written(weight, [_contribution(a, b)])
    assert used_rows
    _assert_rounded_once(value, weight, 0.8, a, b)


def test_bind_switch_and_unbind_through_the_patcher_restore_the_original_bits():
    """Through the patcher (first touch adds in place, a switch copies the backup back first), on either path."""
    root = torch.nn.Module()
    root.proj = torch.nn.Linear(COLS, ROWS, bias=False).to(torch.bfloat16)
    with torch.no_grad():
        root.proj.weight.copy_(_weight(7))
    original = root.proj.weight.detach().clone()
    patcher = WeightPatcher({"transformer": root})

    def layer(delta, key: str) -> PatchLayer:
        return PatchLayer(key=key, component="transformer", strength=1.0,
                          targets={"proj": TargetPatch(module="proj", low_rank=delta, param_diffs={})},
                          name="lora.safetensors")

    a, b = _pair(8), _pair(9)
    patcher.apply([layer(a, "a")])
    assert torch.equal(root.proj.weight, _written(original, [_contribution(a, strength=1.0)])[0])
    patcher.apply([layer(b, "b")])
    assert torch.equal(root.proj.weight, _written(original, [_contribution(b, strength=1.0)])[0])
    _assert_rounded_once(root.proj.weight.detach(), original, 1.0, b)
    patcher.restore_all()
    assert torch.equal(root.proj.weight, original)


@pytest.mark.filterwarnings("ignore:TF32 acceleration")  # torch's note when its oneDNN flags are set on a CPU build
def test_with_onednn_switched_off_the_rows_are_used():
    """torch's own bfloat16 gemm without oneDNN is a plain loop (about 100 times slower): the row path instead."""
    weight, delta = _weight(), _pair(10)
    with torch.backends.mkldnn.flags(enabled=False):
        value, used_rows = _written(weight, [_contribution(delta)])
    assert used_rows
    _assert_rounded_once(value, weight, 0.8, delta)


def test_a_float32_destination_apart_from_its_original_is_written_in_place_with_the_buffered_bits(monkeypatch):
    """A host's float32 weight (ComfyUI's on CPU) is computed in its own rows, without the work buffer: the same
    bits as the buffered row path (which a destination holding its own original still takes)."""
    weight = (torch.randn(ROWS, COLS, generator=torch.Generator().manual_seed(3)) * 0.02)
    contribution = _contribution(_pair(4, dtype=torch.float32), _pair(5, dtype=torch.float32), strength=0.7)
    taken = []
    take = fused_rows.Workspace.take
    monkeypatch.setattr(fused_rows.Workspace, "take", lambda self, *a: taken.append(a) or take(self, *a))
    in_place = torch.empty_like(weight)
    fused_rows.write_patched(in_place, weight, [contribution])
    assert taken == []  # no work buffer
    buffered = weight.clone()
    fused_rows.write_patched(buffered, buffered, [contribution])
    assert len(taken) == 1 and torch.equal(in_place, buffered) and not torch.equal(in_place, weight)
