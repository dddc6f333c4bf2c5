"""The a-priori overflow bound (issue 33): a fuse proves its result finite from the factors and ``max|W|`` instead
of scanning what it wrote, refuses a certain overflow before writing, and scans only what it cannot prove."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from lorabind.loaders.binding import fused_rows
from lorabind.loaders.binding.patching import PatchLayer, WeightPatcher
from lorabind.loaders.errors import LoraBindError
from lorabind.loaders.lora import finite_bounds
from lorabind.loaders.lora.canonical import TargetPatch
from lorabind.loaders.lora.kinds import low_rank
from lorabind.loaders.lora.kinds.full_diff import FullDiff
from lorabind.loaders.lora.kinds.loha import LohaDelta
from lorabind.loaders.lora.kinds.lokr import LokrDelta
from lorabind.loaders.lora.kinds.low_rank import LowRankDelta


def _counted(monkeypatch, owner, name: str, key: str) -> dict:
    """``{key: calls}`` of ``owner.name`` from now on (the function still runs)."""
    count = {key: 0}
    real = getattr(owner, name)

    def counting(*args, **kwargs):
        count[key] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(owner, name, counting)
    return count


@pytest.fixture
def scans(monkeypatch):
    """How many written chunks were scanned for non-finite values."""
    return _counted(monkeypatch, fused_rows, "chunk_is_finite", "chunks")


def _linear(weight: torch.Tensor) -> torch.nn.Module:
    root = torch.nn.Module()
    root.proj = torch.nn.Linear(weight.shape[1], weight.shape[0], bias=True).to(weight.dtype)
    with torch.no_grad():
        root.proj.weight.copy_(weight)
        root.proj.bias.zero_()
    return root


def _layer(delta, strength=1.0, bias=None) -> PatchLayer:
    target = TargetPatch(module="proj", low_rank=delta, param_diffs={} if bias is None else {"bias": bias})
    return PatchLayer(key="lora", component="transformer", strength=strength, targets={"proj": target},
                      name="lora.safetensors")


def test_the_bound_refuses_an_overflowing_delta_without_scanning(scans):
    """Finite bf16 factors whose product (2e38 x 8 x strength 4) is past bf16's range: refused before any write,
    naming the parameter, with no chunk scanned."""
    delta = LowRankDelta(down=torch.full((8, 16), 1e19, dtype=torch.bfloat16),
                         up=torch.full((16, 8), 1e19, dtype=torch.bfloat16), alpha=None, scale=1.0)
    root = _linear(torch.randn(16, 16, dtype=torch.bfloat16))
    before = root.proj.weight.detach().clone()
    patcher = WeightPatcher({"transformer": root})
    with pytest.raises(LoraBindError, match=r"transformer:proj.weight: the fused value is not finite in bfloat16 at "
                                            r"element \[0, 0\]"):
        patcher.apply([_layer(delta, strength=4.0)])
    assert scans["chunks"] == 0
    assert torch.equal(root.proj.weight, before) and patcher.patched == set()


def test_an_ordinary_fuse_is_proven_finite_and_never_scanned(scans):
    g = torch.Generator().manual_seed(0)
    weight = torch.randn(64, 48, generator=g).to(torch.bfloat16)
    delta = LowRankDelta(down=torch.randn(4, 48, generator=g).to(torch.bfloat16),
                         up=torch.randn(64, 4, generator=g).to(torch.bfloat16), alpha=4.0, scale=0.5)
    bias = torch.randn(64, generator=g).to(torch.bfloat16)
    root = _linear(weight)
    WeightPatcher({"transformer": root}).apply([_layer(delta, strength=0.7, bias=bias)])
    assert scans["chunks"] == 0
    want = weight.double() + 0.7 * 0.5 * (delta.up.double() @ delta.down.double())
    assert (root.proj.weight.double() - want).abs().max().item() <= 0.05  # one bf16 rounding of values ~10
    assert torch.allclose(root.proj.bias.double(), 0.7 * bias.double(), atol=1e-2)


def test_what_the_bound_cannot_prove_is_scanned_and_fused_when_it_stays_finite(scans):
    """max|W| = 3.3e38 and a delta of 2e37 elsewhere: the bound (3.5e38) proves nothing, the peak element does not
    overflow either, so the chunks are scanned, found finite, and the fuse lands."""
    weight = torch.zeros(4, 4, dtype=torch.bfloat16)
    weight[0, 0] = 3.3e38
    down = torch.zeros(1, 4, dtype=torch.bfloat16)
    up = torch.zeros(4, 1, dtype=torch.bfloat16)
    down[0, 1], up[1, 0] = 2e18, 1e19
    root = _linear(weight)
    WeightPatcher({"transformer": root}).apply([_layer(LowRankDelta(down=down, up=up, alpha=None, scale=1.0))])
    assert scans["chunks"] > 0
    assert torch.isfinite(root.proj.weight).all()
    assert root.proj.weight[1, 1].item() == pytest.approx(2e37, rel=1e-2)


@pytest.fixture
def weight_passes(monkeypatch):
    """How many times the fuse computed ``max|W|`` of a weight (a pass over all of it)."""
    return _counted(monkeypatch, fused_rows, "largest_abs", "passes")


def _one_element_delta(value: float, dtype: torch.dtype) -> LowRankDelta:
    """A rank-1 pair whose product is ``value`` at [0, 0] and zero elsewhere (a 4 x 4 weight)."""
    down, up = torch.zeros(1, 4, dtype=dtype), torch.zeros(4, 1, dtype=dtype)
    down[0, 0], up[0, 0] = value, 1.0
    return LowRankDelta(down=down, up=up, alpha=None, scale=1.0)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_a_delta_within_a_quarter_spacing_at_the_largest_value_needs_no_pass_over_the_weight(
        scans, weight_passes, dtype):
    """The weight holds the dtype's largest finite value M; a delta of an eighth of the spacing at M pushes it up,
    yet cannot carry it to Inf: proven from the delta alone (no ``max|W|`` pass, no scan), and M stays M."""
    largest = float(torch.finfo(dtype).max)
    spacing = 2.0 ** math.ceil(math.log2(largest)) - largest
    weight = torch.zeros(4, 4, dtype=dtype)
    weight[0, 0], weight[1, 1] = largest, -largest
    root = _linear(weight)
    WeightPatcher({"transformer": root}).apply([_layer(_one_element_delta(spacing / 8, dtype))])
    assert (scans["chunks"], weight_passes["passes"]) == (0, 0)
    assert root.proj.weight[0, 0].item() == largest and root.proj.weight[1, 1].item() == -largest


@pytest.fixture
def norm_passes(monkeypatch):
    """How many factor norms a fuse computed (the tight bound's float32 pass over a factor)."""
    return _counted(monkeypatch, low_rank, "largest_norm", "norms")


def test_an_ordinary_fuse_is_proven_by_the_rough_bound_without_factor_norms(scans, weight_passes, norm_passes):
    g = torch.Generator().manual_seed(5)
    delta = LowRankDelta(down=torch.randn(8, 48, generator=g).to(torch.bfloat16),
                         up=torch.randn(64, 8, generator=g).to(torch.bfloat16), alpha=8.0, scale=1.0)
    WeightPatcher({"transformer": _linear(torch.randn(64, 48, generator=g).to(torch.bfloat16))}).apply(
        [_layer(delta)])
    assert (scans["chunks"], weight_passes["passes"], norm_passes["norms"]) == (0, 0, 0)


def test_where_the_rough_bound_is_not_enough_the_norms_prove_it(scans, weight_passes, norm_passes):
    """A rank-64 pair whose largest elements sit in different rows: the rough bound (r · max|up| · max|down|)
    is 64 times the true one and exceeds float16's margin (8), the Cauchy–Schwarz bound from the norms proves
    it (still without a pass over the weight)."""
    down, up = torch.zeros(64, 16, dtype=torch.float16), torch.zeros(16, 64, dtype=torch.float16)
    for k in range(64):
        down[k, k % 16], up[k % 16, k] = 0.5, 0.5  # each product term sits alone in its row and column
    delta = LowRankDelta(down=down, up=up, alpha=None, scale=1.0)
    root = _linear(torch.zeros(16, 16, dtype=torch.float16))
    WeightPatcher({"transformer": root}).apply([_layer(delta)])
    assert (scans["chunks"], weight_passes["passes"]) == (0, 0) and norm_passes["norms"] == 2
    assert root.proj.weight[0, 0].item() == 1.0  # four terms of 0.25 at the element of row 0 and column 0


def test_a_larger_delta_is_proven_with_the_weights_largest_value(scans, weight_passes):
    """A delta of one spacing at bfloat16's largest value proves nothing alone; with max|W| = 1 it is proven
    finite after one pass over the weight, and written without a scan."""
    spacing = 2.0 ** 120
    root = _linear(torch.ones(4, 4, dtype=torch.bfloat16))
    WeightPatcher({"transformer": root}).apply([_layer(_one_element_delta(spacing, torch.bfloat16))])
    assert (scans["chunks"], weight_passes["passes"]) == (0, 1)
    assert root.proj.weight[0, 0].item() == spacing and root.proj.weight[0, 1].item() == 1.0


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("size", [1.0, 1e-30, 1e30])  # ordinary; squares underflow float32; squares overflow it
@pytest.mark.parametrize("dim", [0, 1])
def test_largest_norm_is_an_upper_bound_close_to_the_float64_norm(dtype, size, dim):
    """Summed in float32 where it can be (with a rounding margin), in float64 where float32 squares overflow:
    never below the exact norm of the longest row/column, and within 1e-5 of it (or of the underflow margin)."""
    if size * 2 > float(torch.finfo(dtype).max) or size < float(torch.finfo(dtype).tiny):
        pytest.skip("not representable in this dtype")
    matrix = (torch.randn(96, 200, generator=torch.Generator().manual_seed(3)) * size).to(dtype)
    exact = matrix.double().square().sum(dim=dim).sqrt()
    norm, index = finite_bounds.largest_norm(matrix, dim=dim)
    assert norm >= exact.max().item()
    assert norm <= exact.max().item() * (1 + 1e-5) + math.sqrt(matrix.shape[dim] * 2.0 ** -149) * 1.01
    if size >= 1:  # where every square underflows, all sums are 0 and the index says nothing
        assert exact[index].item() >= exact.max().item() * (1 - 1e-4)


def _computed(delta, shape) -> torch.Tensor:
    """The delta exactly as the fuse computes it: the kind's float32 rows, added to zeros."""
    chunk = torch.zeros(shape[0], int(torch.tensor(shape[1:]).prod()), dtype=torch.float32)
    base_rows = SimpleNamespace(rows=chunk.shape[0], cols=chunk.shape[1])  # read by the full diff only
    delta.row_adder(torch.device("cpu"), base_rows)(chunk, 0, shape[0], 1.0)
    return chunk


def _kinds(g):
    def r(*shape):
        return torch.randn(*shape, generator=g)

    return {
        "lora": (LowRankDelta(down=r(4, 24), up=r(12, 4), alpha=2.0, scale=0.5), (12, 24)),
        "lora rank 1, aligned (tight)": (LowRankDelta(down=torch.ones(1, 24), up=torch.ones(12, 1), alpha=None,
                                                      scale=1.0), (12, 24)),
        "loha": (LohaDelta(r(12, 3), r(3, 24), r(12, 3), r(3, 24), alpha=1.5, scale=0.5), (12, 24)),
        "loha tucker": (LohaDelta(r(3, 6), r(3, 4), r(3, 6), r(3, 4), alpha=3.0, scale=1.0, t1=r(3, 3, 3, 3),
                                  t2=r(3, 3, 3, 3)), (6, 4, 3, 3)),
        "lokr factored": (LokrDelta(w1=(r(2, 3), r(3, 2)), w2=(r(6, 3), r(3, 12)), alpha=3.0, scale=1.0), (12, 24)),
        "lokr tucker": (LokrDelta(w1=(r(2, 2),), w2=(r(3, 3), r(3, 2), r(3, 3, 3, 3)), alpha=6.0, scale=2.0),
                        (6, 4, 3, 3)),
        "full diff": (FullDiff(r(12, 24)), (12, 24)),
    }


@pytest.mark.parametrize("name", list(_kinds(torch.Generator().manual_seed(1))))
def test_each_kinds_bound_covers_what_the_fuse_computes(name):
    delta, shape = _kinds(torch.Generator().manual_seed(1))[name]
    largest = _computed(delta, shape).abs().max().item()
    bound = delta.abs_bound()
    assert largest <= bound
    rough = getattr(delta, "rough_abs_bound", lambda: None)()
    assert rough is None or bound <= rough * 1.0001  # looser (or equal), so a bound as well
    if "tight" in name:
        assert bound <= largest * 1.0001  # Cauchy-Schwarz is an equality for aligned vectors


def test_a_re_bind_passes_over_no_factor_or_diff_again(monkeypatch):
    """Speed (issue 47): the bounds of a LoRA's deltas are computed once per read of its file. A strength change
    and a switch back re-plan the same ``TargetPatch`` (the bind memoises it per file), and its pair and bias diff
    are not scanned again (each re-bind used to pass over every factor and every diff), while the values still
    change as asked."""
    g = torch.Generator().manual_seed(3)
    delta = LowRankDelta(down=torch.randn(4, 48, generator=g).to(torch.bfloat16),
                         up=torch.randn(64, 4, generator=g).to(torch.bfloat16), alpha=4.0, scale=0.5)
    target = TargetPatch(module="proj", low_rank=delta, param_diffs={"bias": torch.randn(64, generator=g)})
    root = _linear(torch.randn(64, 48, generator=g).to(torch.bfloat16))
    patcher = WeightPatcher({"transformer": root})

    def layer(strength):
        return PatchLayer(key="lora", component="transformer", strength=strength, targets={"proj": target})

    patcher.apply([layer(1.0)])
    passes = _counted(monkeypatch, finite_bounds, "largest_abs", "factor passes")
    monkeypatch.setattr(low_rank, "largest_abs", finite_bounds.largest_abs)
    from lorabind.loaders.lora.kinds import full_diff
    monkeypatch.setattr(full_diff, "largest_abs", finite_bounds.largest_abs)
    bias_at = {}
    for strength in (0.5, 1.0, 0.25):
        patcher.apply([layer(strength)])
        bias_at[strength] = root.proj.bias.detach().clone()
    assert passes["factor passes"] == 0
    assert torch.equal(bias_at[0.5] * 2, bias_at[1.0]) and torch.equal(bias_at[0.25] * 4, bias_at[1.0])
