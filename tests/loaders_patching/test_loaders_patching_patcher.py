"""WeightPatcher: exact fuse, bit-exact restore, stacking, incremental re-application, transactions."""

from __future__ import annotations

import pytest
import torch
from patching_helpers import assert_bit_identical, block_modules, make_targets, random_low_rank, snapshot

from lorabind.loaders.errors import KeyMatchError
from lorabind.loaders.lora.canonical import TargetPatch
from lorabind.loaders.patching import PatchLayer, WeightPatcher


def reference(weight, contributions):
    """Independent reference: original + Σ strength·scale·(up@down) + Σ strength·diff, in float64."""
    value = weight.detach().to(torch.float64).clone()
    for strength, target, param in contributions:
        if param == "weight" and target.low_rank is not None:
            lr = target.low_rank
            up = lr.up.double().flatten(1)
            down = lr.down.double().flatten(1)
            value += strength * lr.scale * (up @ down).reshape(value.shape)
        if param in target.param_diffs:
            value += strength * target.param_diffs[param].double().reshape(value.shape)
    return value


def test_fused_weights_equal_an_independent_reference_fp32(make_transformer):
    model = make_transformer()
    base = snapshot(model)
    targets = make_targets(model, block_modules(), rank=4, alpha=8.0, seed=1, bias=True)
    # a Conv3d low-rank target and full diffs on a norm and on the modulation table
    g = torch.Generator().manual_seed(7)
    targets["patch_embedding"] = TargetPatch("patch_embedding", random_low_rank(model.patch_embedding, 2, 3))
    targets["blocks.0.norm2"] = TargetPatch("blocks.0.norm2", None, {
        "weight": torch.randn(model.blocks[0].norm2.weight.shape, generator=g) * 0.01,
        "bias": torch.randn(model.blocks[0].norm2.bias.shape, generator=g) * 0.01})
    targets["blocks.1"] = TargetPatch("blocks.1", None, {
        "scale_shift_table": torch.randn(model.blocks[1].scale_shift_table.shape, generator=g) * 0.01})
    patcher = WeightPatcher({"transformer": model})
    result = patcher.apply([PatchLayer("lora-a", "transformer", 0.7, targets)])

    expected_params = {f"transformer:{m}.weight" for m, t in targets.items() if t.low_rank is not None}
    expected_params |= {f"transformer:{m}.{p}" for m, t in targets.items() for p in t.param_diffs}
    assert patcher.last_written == expected_params
    assert result.written == len(expected_params) and result.restored == 0
    state = model.state_dict()
    for pid in expected_params:
        module_path, param = pid.split(":", 1)[1].rsplit(".", 1)
        target = targets[module_path]
        ref = reference(base[f"{module_path}.{param}"], [(0.7, target, param)])
        assert (state[f"{module_path}.{param}"].double() - ref).abs().max().item() <= 1e-6
    untouched = set(base) - {p.split(":", 1)[1] for p in expected_params}
    assert all(torch.equal(base[k], state[k]) for k in untouched)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_restore_is_bit_exact(make_transformer, dtype):
    model = make_transformer(dtype)
    base = snapshot(model)
    patcher = WeightPatcher({"transformer": model})
    layers = [PatchLayer("a", "transformer", 1.0, make_targets(model, block_modules(), seed=2, bias=True, dtype=dtype)),
              PatchLayer("b", "transformer", -0.3, make_targets(model, block_modules((1,)), seed=3, dtype=dtype))]
    patcher.apply(layers)
    assert not torch.equal(base["blocks.1.attn1.to_q.weight"], model.state_dict()["blocks.1.attn1.to_q.weight"])
    result = patcher.restore_all()
    assert result.restored == len(patcher.last_written) > 0
    assert_bit_identical(base, model)
    assert patcher.patched == set() and patcher.backup_bytes() == 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_two_stacked_loras_equal_the_fp32_sum_cast_once(make_transformer, dtype):
    model = make_transformer(dtype)
    base = snapshot(model)
    mods = block_modules((0,))
    ta = make_targets(model, mods, rank=4, alpha=8.0, seed=4, dtype=dtype)
    tb = make_targets(model, mods, rank=8, alpha=None, seed=5, dtype=dtype)
    patcher = WeightPatcher({"transformer": model})
    patcher.apply([PatchLayer("a", "transformer", 0.8, ta), PatchLayer("b", "transformer", 0.5, tb)])
    ab = snapshot(model)
    for m in mods:
        key = f"{m}.weight"
        ref = reference(base[key], [(0.8, ta[m], "weight"), (0.5, tb[m], "weight")])
        if dtype == torch.float32:
            assert (ab[key].double() - ref).abs().max().item() <= 1e-6
        else:  # one rounding of the exact sum: at most one bf16 step away from the float64 reference
            step = ref.abs().clamp_min(2.0 ** -126) * 2.0 ** -7
            assert bool(((ab[key].double() - ref).abs() <= step).all())
    # the order of the layers does not change a single bit
    patcher.restore_all()
    patcher.apply([PatchLayer("b", "transformer", 0.5, tb), PatchLayer("a", "transformer", 0.8, ta)])
    assert_bit_identical(ab, model)


def test_changing_one_strength_touches_only_that_loras_layers(make_transformer):
    model = make_transformer()
    attn = block_modules(names=("attn1.to_q", "attn1.to_k"))
    ffn = block_modules(names=("ffn.net.0.proj", "ffn.net.2"))
    ta = make_targets(model, attn, seed=6, bias=True)
    tb = make_targets(model, ffn, seed=7)
    patcher = WeightPatcher({"transformer": model})
    patcher.apply([PatchLayer("a", "transformer", 1.0, ta), PatchLayer("b", "transformer", 1.0, tb)])
    before = snapshot(model)

    result = patcher.apply([PatchLayer("a", "transformer", 1.0, ta), PatchLayer("b", "transformer", 0.25, tb)])
    assert patcher.last_written == {f"transformer:{m}.weight" for m in ffn}
    assert (result.written, result.restored, result.unchanged) == (len(ffn), 0, 2 * len(attn))
    after = model.state_dict()
    assert all(torch.equal(before[f"{m}.{p}"], after[f"{m}.{p}"]) for m in attn for p in ("weight", "bias"))

    # the same patch set again writes nothing at all
    written_so_far = patcher.stats.tensors_written
    result = patcher.apply([PatchLayer("b", "transformer", 0.25, tb), PatchLayer("a", "transformer", 1.0, ta)])
    assert patcher.last_written == set() and result.written == 0 and result.restored == 0
    assert patcher.stats.tensors_written == written_so_far

    # strength 0 is "off": its parameters go back to the original, the other LoRA's stay untouched
    result = patcher.apply([PatchLayer("a", "transformer", 1.0, ta), PatchLayer("b", "transformer", 0.0, tb)])
    assert patcher.last_written == {f"transformer:{m}.weight" for m in ffn} and result.restored == len(ffn)


class Boom(RuntimeError):
    pass


def interrupt_after(n):
    calls = {"n": 0}

    def check():
        calls["n"] += 1
        if calls["n"] > n:
            raise Boom("interrupted by test")

    return check


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fault_mid_fuse_leaves_every_weight_bit_identical(make_transformer, dtype):
    model = make_transformer(dtype)
    base = snapshot(model)
    patcher = WeightPatcher({"transformer": model})
    ta = make_targets(model, block_modules(), seed=8, bias=True, dtype=dtype)
    with pytest.raises(Boom):
        patcher.apply([PatchLayer("a", "transformer", 1.0, ta)], check_interrupt=interrupt_after(5))
    assert_bit_identical(base, model)
    assert patcher.patched == set()

    # from a patched state: an interrupted switch to another patch set leaves exactly the previous patched state
    patcher.apply([PatchLayer("a", "transformer", 1.0, ta)])
    patched = snapshot(model)
    tb = make_targets(model, block_modules(), seed=9, dtype=dtype)
    new_set = [PatchLayer("a", "transformer", 0.5, ta), PatchLayer("b", "transformer", 1.0, tb)]
    with pytest.raises(Boom):
        patcher.apply(new_set, check_interrupt=interrupt_after(7))
    assert_bit_identical(patched, model)
    # and the patcher still knows the true state: restoring gives the originals back
    patcher.restore_all()
    assert_bit_identical(base, model)


def test_keyboard_interrupt_from_progress_callback_rolls_back(make_transformer):
    model = make_transformer()
    base = snapshot(model)
    patcher = WeightPatcher({"transformer": model})

    def progress(done, total):
        if done == 3:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        patcher.apply([PatchLayer("a", "transformer", 1.0, make_targets(model, block_modules(), seed=10))],
                      on_progress=progress)
    assert_bit_identical(base, model)


def test_bad_target_is_refused_before_any_write(make_transformer):
    model = make_transformer()
    base = snapshot(model)
    patcher = WeightPatcher({"transformer": model})
    good = make_targets(model, block_modules(), seed=11)
    wrong = make_targets(model, ["blocks.0.ffn.net.0.proj"], seed=12)
    bad = {**good, "blocks.1.attn1.to_q": TargetPatch("blocks.1.attn1.to_q", wrong["blocks.0.ffn.net.0.proj"].low_rank)}
    with pytest.raises(KeyMatchError) as err:
        patcher.apply([PatchLayer("x", "transformer", 1.0, bad, name="style.safetensors")])
    message = str(err.value)
    assert "style.safetensors" in message and "transformer:blocks.1.attn1.to_q.weight" in message
    assert "[24, 24]" in message and "[32, 24]" in message
    with pytest.raises(KeyMatchError, match="'blocks.9.attn1.to_q' does not exist"):
        patcher.apply([PatchLayer("x", "transformer", 1.0, {"blocks.9.attn1.to_q": good["blocks.0.attn1.to_q"]})])
    with pytest.raises(KeyMatchError, match="component 'transformer_2'"):
        patcher.apply([PatchLayer("x", "transformer_2", 1.0, good)])
    assert_bit_identical(base, model)
    assert patcher.stats.tensors_written == 0
