"""WeightPatcher: exact fuse, bit-exact restore, stacking, incremental re-application, transactions."""

from __future__ import annotations

import pytest
import torch

from engine_probes import backup_bytes
from lorabind.loaders.binding.patching import PatchLayer, WeightPatcher
from lorabind.loaders.errors import KeyMatchError
from lorabind.loaders.lora.canonical import TargetPatch
from patching_helpers import assert_bit_identical, block_modules, make_targets, random_low_rank, snapshot


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
    assert patcher.patched == set() and backup_bytes(patcher) == 0


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


def test_peak_memory_is_the_backups_plus_one_layer(make_transformer):
    """No whole-model copy: while fusing every linear of the model, the tensors alive at once are the exact
    backups plus one layer's float32 temporaries (the in-flight parameter and its delta)."""
    from patching_helpers import LiveTensorBytes

    model = make_transformer(torch.bfloat16)
    modules = block_modules() + ["proj_out", "condition_embedder.time_proj", "patch_embedding"]
    targets = make_targets(model, modules, rank=4, seed=9, bias=True, dtype=torch.bfloat16)
    patched = [p for m in modules for p in (model.get_submodule(m).weight, model.get_submodule(m).bias)]
    model_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    patcher = WeightPatcher({"transformer": model})
    with LiveTensorBytes() as tracked:
        patcher.apply([PatchLayer("lora", "transformer", 1.0, targets)])
    backups = sum(p.numel() * p.element_size() for p in patched)
    assert backup_bytes(patcher) == backups  # exactly the originals of what was written, nothing more
    largest_fp32 = max(p.numel() for p in patched) * 4
    factors_fp32 = max((t.low_rank.up.numel() + t.low_rank.down.numel()) * 4 for t in targets.values())
    assert backups <= tracked.peak <= backups + 2 * largest_fp32 + factors_fp32
    assert backups + 2 * largest_fp32 + factors_fp32 < backups + model_bytes  # the bound excludes a model copy


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fault_inside_a_layer_write_rolls_back(make_transformer, monkeypatch, dtype):
    """A failure while computing a parameter (e.g. out of memory), after earlier parameters of the same call and
    of the same module were written, leaves every weight bit-identical to before the call."""
    from lorabind.loaders.binding import patching

    model = make_transformer(dtype)
    patcher = WeightPatcher({"transformer": model})
    ta = make_targets(model, block_modules(), seed=13, bias=True, dtype=dtype)
    patcher.apply([PatchLayer("a", "transformer", 1.0, ta)])
    patched = snapshot(model)
    real, calls = patching.write_patched, {"n": 0}

    def failing(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 6:  # the bias of the third module: its weight was just written
            raise MemoryError("simulated out of memory")
        return real(*args, **kwargs)

    monkeypatch.setattr(patching, "write_patched", failing)
    with pytest.raises(MemoryError):
        patcher.apply([PatchLayer("a", "transformer", 0.3, ta)])
    assert_bit_identical(patched, model)
    monkeypatch.setattr(patching, "write_patched", real)
    patcher.restore_all()
    assert patcher.patched == set() and backup_bytes(patcher) == 0


@pytest.mark.parametrize("chunk_bytes", [64, 1 << 20])
def test_row_chunked_fuse_matches_a_float64_reference_for_linear_and_conv(make_transformer, monkeypatch, chunk_bytes):
    """64 bytes forces many row chunks per parameter (a few rows each); the result must not depend on it."""
    from lorabind.loaders.binding import fused_rows

    monkeypatch.setattr(fused_rows, "CHUNK_BYTES", chunk_bytes)
    model = make_transformer()
    base = snapshot(model)
    paths = ["blocks.0.ffn.net.0.proj", "blocks.1.attn2.to_out.0", "patch_embedding"]
    targets = make_targets(model, paths, seed=21, bias=True)
    WeightPatcher({"transformer": model}).apply([PatchLayer("a", "transformer", 0.7, targets)])
    for path, target in targets.items():
        module = model.get_submodule(path)
        lr = target.low_rank
        delta = (lr.up.double().reshape(lr.up.shape[0], -1) @ lr.down.double().reshape(lr.down.shape[0], -1))
        want_w = base[f"{path}.weight"].double() + 0.7 * lr.scale * delta.reshape(module.weight.shape)
        want_b = base[f"{path}.bias"].double() + 0.7 * target.param_diffs["bias"].double()
        assert (module.weight.double() - want_w).abs().max().item() <= 1e-6
        assert (module.bias.double() - want_b).abs().max().item() <= 1e-6
