"""Dynamic peft adapters through bind(): exact scales (PEFT folders with lora_alpha != r), LRU, removal."""

from __future__ import annotations

import json
import os

import pytest
import torch

from engine_probes import active_adapters
from lorabind.loaders.binding.bind import bind, binding_state, release_adapters, unbind
from lorabind.loaders.binding.peft_adapters import AdapterError, to_peft_groups
from lorabind.loaders.handles import AdapterSpec, FuseSpec
from lorabind.loaders.lora import clear_lora_cache
from lorabind.loaders.lora.canonical import TargetPatch
from patching_helpers import (
    assert_bit_identical,
    block_modules,
    forward,
    make_targets,
    random_low_rank,
    snapshot,
    write_diffusers_lora,
)


@pytest.fixture(autouse=True)
def _fresh_reader_cache():
    clear_lora_cache()
    yield
    clear_lora_cache()


def fused_by_hand(module, deltas):
    """Manual reference: add each (module path, delta weight, delta bias) to a copy's parameters, in float64."""
    with torch.no_grad():
        for path, dw, db in deltas:
            layer = module.get_submodule(path)
            layer.weight.copy_((layer.weight.double() + dw).to(layer.weight.dtype))
            if db is not None:
                layer.bias.copy_((layer.bias.double() + db).to(layer.bias.dtype))
    return module


def low_rank_deltas(targets, scale, run_scale):
    out = []
    for path, t in targets.items():
        dw = run_scale * scale * (t.low_rank.up.double() @ t.low_rank.down.double())
        db = run_scale * t.param_diffs["bias"].double() if "bias" in t.param_diffs else None
        out.append((path, dw, db))
    return out


@pytest.fixture
def peft_folder(tmp_path, make_transformer):
    """A PEFT folder (adapter_config.json + adapter_model.safetensors) with r=4, lora_alpha=16 (scale 4)."""
    from peft import LoraConfig
    from safetensors.torch import save_file

    ref = make_transformer()
    targets = make_targets(ref, block_modules(names=("attn1.to_q", "attn1.to_k", "ffn.net.2")), rank=4, seed=31)
    folder = tmp_path / "style_peft"
    folder.mkdir()
    config = LoraConfig(r=4, lora_alpha=16, target_modules=["to_q", "to_k", "ffn.net.2"])
    config.save_pretrained(str(folder))
    tensors = {}
    for path, t in targets.items():
        tensors[f"base_model.model.{path}.lora_A.weight"] = t.low_rank.down
        tensors[f"base_model.model.{path}.lora_B.weight"] = t.low_rank.up
    save_file(tensors, str(folder / "adapter_model.safetensors"))
    assert json.loads((folder / "adapter_config.json").read_text())["lora_alpha"] == 16
    return str(folder), targets


@pytest.mark.slow
def test_peft_folder_with_alpha_not_rank_runs_at_its_exact_scale(make_model, make_transformer, peft_folder):
    folder, targets = peft_folder
    model = make_model()
    base_out = forward(model.components["transformer"])
    report = bind(model, [], [AdapterSpec(folder, 0.5, "transformer", "style_peft")])
    out = forward(model.components["transformer"])
    # manual reference: W + run_scale · (lora_alpha / r) · B @ A  (diffusers would use alpha = r here)
    expected = forward(fused_by_hand(make_transformer(), low_rank_deltas(targets, 16 / 4, 0.5)))
    wrong_scale = forward(fused_by_hand(make_transformer(), low_rank_deltas(targets, 1.0, 0.5)))
    assert (out - expected).abs().max().item() <= 1e-5
    assert (wrong_scale - expected).abs().max().item() > 100 * (out - expected).abs().max().item()
    assert (out - base_out).abs().max().item() > 1e-3
    assert report.adapters[0]["name"] == "style_peft" and report.adapters[0]["scale"] == 0.5
    assert report.written == 0  # a dynamic adapter writes no base weight


def test_single_file_adapter_with_bias_diffs_matches_the_manual_reference(make_model, make_transformer, tmp_path):
    targets = make_targets(make_transformer(), block_modules(names=("attn2.to_v", "ffn.net.0.proj")), rank=8,
                           alpha=4.0, seed=32, bias=True)
    path = write_diffusers_lora(tmp_path / "single.safetensors", targets, alpha=4.0)
    model = make_model()
    bind(model, [], [AdapterSpec(path, 1.5, "transformer")])
    expected = forward(fused_by_hand(make_transformer(), low_rank_deltas(targets, 4.0 / 8, 1.5)))
    assert (forward(model.components["transformer"]) - expected).abs().max().item() <= 1e-5


def test_scale_zero_switching_and_removal_are_exact(make_model, make_transformer, peft_folder, tmp_path):
    folder, folder_targets = peft_folder
    other_targets = make_targets(make_transformer(), block_modules(names=("attn1.to_v", "attn1.to_q")), seed=33)
    other = write_diffusers_lora(tmp_path / "other.safetensors", other_targets)
    model = make_model()
    module = model.components["transformer"]
    base_state = snapshot(module)
    base_out = forward(module)

    bind(model, [], [AdapterSpec(folder, 1.0)])
    out_a = forward(module)
    bind(model, [], [AdapterSpec(other, 1.0)])
    out_b = forward(module)
    cache = binding_state(model).adapters
    injections = cache.injections
    # switching back re-uses the injected adapter, and gives the same output again
    bind(model, [], [AdapterSpec(folder, 1.0)])
    assert cache.injections == injections == 2
    assert torch.equal(forward(module), out_a) and not torch.equal(out_a, out_b)
    # scale 0 = off: exactly the base output
    bind(model, [], [AdapterSpec(folder, 0.0)])
    assert torch.equal(forward(module), base_out)
    # base weights were never written while adapters were attached
    base_now = {k.replace(".base_layer.", "."): v for k, v in module.state_dict().items() if "lora_" not in k}
    assert all(torch.equal(base_now[k], base_state[k]) for k in base_state)
    # two adapters at once (both on blocks.*.attn1.to_q): their deltas add up
    bind(model, [], [AdapterSpec(folder, 1.0), AdapterSpec(other, -0.5)])
    deltas = low_rank_deltas(folder_targets, 16 / 4, 1.0) + low_rank_deltas(other_targets, 1.0, -0.5)
    assert (forward(module) - forward(fused_by_hand(make_transformer(), deltas))).abs().max().item() <= 1e-5
    # removing every adapter: the state dict is bit-identical to before (same keys, same values)
    unbind(model)
    release_adapters(model)
    assert_bit_identical(base_state, module)
    assert not hasattr(module, "peft_config") and cache.entries == {}


def test_a_rebind_with_the_same_adapters_skips_the_layer_walk_and_a_change_does_not(make_model, peft_folder,
                                                                                      monkeypatch):
    """A seed-only re-run binds the same adapters at the same scales: setting every peft layer again is skipped,
    and any change of scale still reaches the layers (the output follows it)."""
    folder, _ = peft_folder
    model = make_model()
    module = model.components["transformer"]
    bind(model, [], [AdapterSpec(folder, 1.0)])
    out_full = forward(module)
    cache = binding_state(model).adapters
    walks = {"n": 0}
    real = type(cache)._apply_activation

    def counting(self):
        walks["n"] += 1
        return real(self)

    monkeypatch.setattr(type(cache), "_apply_activation", counting)
    bind(model, [], [AdapterSpec(folder, 1.0)])
    assert walks["n"] == 0 and torch.equal(forward(module), out_full)
    bind(model, [], [AdapterSpec(folder, 0.5)])
    assert walks["n"] == 1 and not torch.equal(forward(module), out_full)
    bind(model, [], [AdapterSpec(folder, 1.0)])
    assert walks["n"] == 2 and torch.equal(forward(module), out_full)


@pytest.mark.slow
def test_lru_eviction_pinning_and_in_use_protection(make_model, make_transformer, tmp_path):
    ref = make_transformer()
    files = [write_diffusers_lora(tmp_path / f"a{i}.safetensors",
                                  make_targets(ref, block_modules((0,), ("attn1.to_q",)), seed=40 + i, bias=True))
             for i in range(4)]
    model = make_model()
    cache = binding_state(model).adapters
    cache.max_size = 2

    def cached():
        return [entry.label for entry in cache.entries.values()]

    bind(model, [], [AdapterSpec(files[0], 1.0)])
    bind(model, [], [AdapterSpec(files[1], 1.0)])
    assert cached() == ["a0.safetensors", "a1.safetensors"]
    bind(model, [], [AdapterSpec(files[2], 1.0)])  # a0 is least recently used
    assert cached() == ["a1.safetensors", "a2.safetensors"]
    binding_state(model).adapters.pin(files[1], "transformer", True)
    bind(model, [], [AdapterSpec(files[3], 1.0)])  # a1 is pinned: a2 goes
    assert cached() == ["a1.safetensors", "a3.safetensors"]
    # all requested adapters are in use: none is evicted, the cache grows and says so
    report = bind(model, [], [AdapterSpec(f, 0.5) for f in files])
    assert sorted(cached()) == [f"a{i}.safetensors" for i in range(4)]
    assert any("cache full" in w for w in report.warnings)
    assert len(cache.active) == 4
    # four adapters with bias diffs on one layer, at 0.5 each: their deltas add up exactly
    deltas = [d for i in range(4) for d in low_rank_deltas(
        make_targets(ref, block_modules((0,), ("attn1.to_q",)), seed=40 + i, bias=True), 1.0, 0.5)]
    expected = forward(fused_by_hand(make_transformer(), deltas))
    assert (forward(model.components["transformer"]) - expected).abs().max().item() <= 1e-5


def test_full_diffs_cannot_be_dynamic(make_model, make_transformer, tmp_path):
    targets = make_targets(make_transformer(), block_modules((0,), ("attn1.to_q",)), seed=50)
    targets["blocks.0.attn1.to_q"].param_diffs["weight"] = torch.zeros(24, 24)
    path = write_diffusers_lora(tmp_path / "with_diff.safetensors", targets)
    model = make_model()
    before = snapshot(model.components["transformer"])
    with pytest.raises(AdapterError, match="FuseDistillLoRA") as err:
        bind(model, [], [AdapterSpec(path, 1.0)])
    assert "with_diff.safetensors" in str(err.value) and "blocks.0.attn1.to_q.weight" in str(err.value)
    assert_bit_identical(before, model.components["transformer"])
    # the same file fuses fine
    report = bind(model, [FuseSpec(path, 1.0, "transformer")], [])
    assert report.written == 1


@pytest.mark.slow
def test_fuse_and_adapter_together_then_unbind_restores_everything(make_model, make_transformer, peft_folder, tmp_path):
    folder, _ = peft_folder
    fused = write_diffusers_lora(tmp_path / "fused.safetensors",
                                 make_targets(make_transformer(), block_modules(), seed=60, bias=True), alpha=8.0)
    model = make_model(torch.bfloat16)
    base = {name: snapshot(m) for name, m in model.components.items()}
    base_out = forward(model.components["transformer"])
    bind(model, [FuseSpec(fused, 1.0, "transformer")], [AdapterSpec(folder, 1.0, "transformer")])
    both = forward(model.components["transformer"])
    assert not torch.equal(both, base_out)
    # re-fusing at another strength while peft wrappers sit on fused layers: accounted and patched through them
    report = bind(model, [FuseSpec(fused, 0.5, "transformer")], [AdapterSpec(folder, 1.0, "transformer")])
    assert report.written == len(block_modules()) * 2 and report.fuses[0]["accounting"]["counts"]["unmatched"] == 0
    bind(model, [FuseSpec(fused, 1.0, "transformer")], [AdapterSpec(folder, 1.0, "transformer")])
    assert torch.equal(forward(model.components["transformer"]), both)
    unbind(model)
    assert torch.equal(forward(model.components["transformer"]), base_out)
    release_adapters(model)
    for name, module in model.components.items():
        assert_bit_identical(base[name], module)


@pytest.mark.slow
def test_interrupted_bind_keeps_the_previous_adapters_and_weights(make_model, make_transformer, peft_folder, tmp_path):
    folder, _ = peft_folder
    ref = make_transformer()
    other = write_diffusers_lora(tmp_path / "other.safetensors", make_targets(ref, block_modules((1,)), seed=70))
    fused = write_diffusers_lora(tmp_path / "fused.safetensors", make_targets(ref, block_modules(), seed=71))
    model = make_model()
    module = model.components["transformer"]
    bind(model, [], [AdapterSpec(folder, 1.0)])
    out_before = forward(module)

    def interrupt():
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        bind(model, [FuseSpec(fused, 1.0, "transformer")], [AdapterSpec(other, 1.0)], check_interrupt=interrupt)
    assert torch.equal(forward(module), out_before)
    assert [e["name"] for e in active_adapters(binding_state(model).adapters)] == ["style_peft"]


def test_a_changed_file_is_a_new_adapter_and_the_stale_one_is_dropped(make_model, make_transformer, tmp_path):
    ref = make_transformer()
    path = tmp_path / "evolving.safetensors"
    write_diffusers_lora(path, make_targets(ref, block_modules((0,)), seed=80))
    model = make_model()
    bind(model, [], [AdapterSpec(str(path), 1.0)])
    first = forward(model.components["transformer"])
    new_targets = make_targets(ref, block_modules((0,)), rank=2, seed=81)
    write_diffusers_lora(path, new_targets)
    os.utime(path, ns=(os.stat(path).st_atime_ns, os.stat(path).st_mtime_ns + 10**9))
    bind(model, [], [AdapterSpec(str(path), 1.0)])
    cache = binding_state(model).adapters
    assert cache.injections == 2 and len(cache.entries) == 1
    expected = forward(fused_by_hand(make_transformer(), low_rank_deltas(new_targets, 1.0, 1.0)))
    out = forward(model.components["transformer"])
    assert (out - expected).abs().max().item() <= 1e-5 and not torch.equal(out, first)


def test_convolution_loras_cannot_be_dynamic(make_model):
    model = make_model()
    conv = {"patch_embedding": TargetPatch("patch_embedding",
                                           random_low_rank(model.components["transformer"].patch_embedding, 2, 1))}
    with pytest.raises(AdapterError, match="convolution LoRA .*FuseDistillLoRA"):
        to_peft_groups(conv, "conv.safetensors")


def test_a_lora_first_fused_after_an_adapter_is_cached_is_accounted_through_the_peft_wrappers(
        make_model, make_transformer, peft_folder, tmp_path):
    folder, _ = peft_folder
    fused = write_diffusers_lora(tmp_path / "later.safetensors",
                                 make_targets(make_transformer(), block_modules(), seed=61), alpha=8.0)
    model = make_model()
    base = snapshot(model.components["transformer"])
    bind(model, [], [AdapterSpec(folder, 1.0, "transformer")])  # wraps the block linears in peft layers
    report = bind(model, [FuseSpec(fused, 1.0, "transformer")], [])
    counts = report.fuses[0]["accounting"]["counts"]
    from safetensors import safe_open

    with safe_open(str(fused), "pt") as fh:
        tensors_in_file = len(list(fh.keys()))
    assert counts["unmatched"] == 0 and counts["applied"] == tensors_in_file
    assert report.written == len(block_modules())
    unbind(model)
    release_adapters(model)
    assert_bit_identical(base, model.components["transformer"])
