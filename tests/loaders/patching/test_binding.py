"""bind()/unbind() on a tiny two-expert Wan model: reads real files, validates everything first, incremental."""

from __future__ import annotations

import json

import pytest
import torch

from lorabind.loaders.binding.bind import bind, binding_state, unbind
from lorabind.loaders.errors import KeyMatchError
from lorabind.loaders.handles import FuseSpec
from lorabind.loaders.lora import clear_lora_cache
from patching_helpers import assert_bit_identical, block_modules, make_targets, snapshot, write_diffusers_lora


@pytest.fixture(autouse=True)
def _fresh_reader_cache():
    clear_lora_cache()
    yield
    clear_lora_cache()


def snapshots(model):
    return {name: snapshot(module) for name, module in model.components.items()}


def assert_model_bit_identical(before, model):
    for name, module in model.components.items():
        assert_bit_identical(before[name], module)


@pytest.fixture
def loras(tmp_path, make_transformer):
    """Two LoRA files: ``attn`` (attention, alpha 8, rank 4, with diff_b) and ``ffn`` (FFN, no alpha)."""
    ref = make_transformer()
    attn = make_targets(ref, block_modules(names=("attn1.to_q", "attn1.to_v", "attn2.to_out.0")), seed=21, bias=True)
    ffn = make_targets(ref, block_modules(names=("ffn.net.0.proj", "ffn.net.2")), rank=2, alpha=None, seed=22)
    return {
        "attn": (write_diffusers_lora(tmp_path / "attn.safetensors", attn, alpha=8.0), attn, 8.0 / 4),
        "ffn": (write_diffusers_lora(tmp_path / "ffn.safetensors", ffn), ffn, 1.0),
    }


def expected_weight(base, target, scale, strength):
    lr = target.low_rank
    return base.double() + strength * scale * (lr.up.double() @ lr.down.double())


def test_bind_fuses_each_file_into_its_component(make_model, loras):
    model = make_model()
    base = snapshots(model)
    attn_path, attn, attn_scale = loras["attn"]
    ffn_path, ffn, _ = loras["ffn"]
    report = bind(model, [FuseSpec(attn_path, 0.8, "transformer", "attn.safetensors"),
                          FuseSpec(ffn_path, 1.5, "transformer_2", "ffn.safetensors")], [])

    high = model.components["transformer"].state_dict()
    for module, target in attn.items():
        ref = expected_weight(base["transformer"][f"{module}.weight"], target, attn_scale, 0.8)
        assert (high[f"{module}.weight"].double() - ref).abs().max().item() <= 1e-6
        ref_b = base["transformer"][f"{module}.bias"].double() + 0.8 * target.param_diffs["bias"].double()
        assert (high[f"{module}.bias"].double() - ref_b).abs().max().item() <= 1e-6
    low = model.components["transformer_2"].state_dict()
    for module, target in ffn.items():
        ref = expected_weight(base["transformer_2"][f"{module}.weight"], target, 1.0, 1.5)
        assert (low[f"{module}.weight"].double() - ref).abs().max().item() <= 1e-6
    # the expert that a file is not meant for is not touched
    assert all(torch.equal(low[k], base["transformer_2"][k]) for k in low if "attn" in k)

    assert report.written == 2 * len(attn) + len(ffn) and report.restored == 0
    assert [f["name"] for f in report.fuses] == ["attn.safetensors", "ffn.safetensors"]
    assert [f["component"] for f in report.fuses] == ["transformer", "transformer_2"]
    # every tensor of the attn file (A, B, alpha, diff_b per module) is accounted as applied
    assert report.fuses[0]["accounting"]["counts"]["applied"] == 4 * len(attn)
    assert report.to_dict()["written"] == report.written
    # the report is the sampler's UI output: files by name only, no local path (loras[...][0] is one)
    assert loras["attn"][0].startswith("/") and loras["attn"][0] not in json.dumps(report.to_dict())


def test_rebinding_the_same_patch_set_writes_nothing(make_model, loras):
    model = make_model()
    fuses = [FuseSpec(loras["attn"][0], 1.0, "transformer"), FuseSpec(loras["ffn"][0], 1.0, "transformer")]
    first = bind(model, fuses, [])
    stats = binding_state(model).stats
    written, passes = stats.tensors_written, stats.fuse_passes
    again = bind(model, list(reversed(fuses)), [])
    assert first.written > 0
    assert (again.written, again.restored, again.unchanged) == (0, 0, first.written)
    assert (stats.tensors_written, stats.fuse_passes, stats.bind_calls) == (written, passes, 2)
    assert binding_state(model).patcher.last_written == set()


def test_a_bind_of_nothing_on_base_weights_touches_nothing_and_reports_as_the_full_path(make_model, loras,
                                                                                       monkeypatch):
    """The shortcut for a workflow without LoRAs: no planning, no apply, the report of the full path; a model
    that still holds a fuse takes the full path and is restored bit-exactly."""
    from lorabind.loaders.binding import bind as binding

    model = make_model()
    before = snapshots(model)
    full = binding._bind_locked(model, binding_state(model), [], [], False, None, None)
    applies = binding_state(model).patcher.stats.apply_calls
    told = []
    monkeypatch.setattr(model, "placement", type("Plan", (), {"after_bind": lambda self, w: told.append(w)})(),
                        raising=False)
    short = bind(model, [], [])
    assert told == [{}]  # the memory plan hears of it as of any bind that wrote nothing
    monkeypatch.setattr(model, "placement", None, raising=False)
    assert short.to_dict() == full.to_dict() == {"fuses": [], "adapters": [], "written": 0, "restored": 0,
                                                 "unchanged": 0, "warnings": [], "restore_sources": {}}
    assert binding_state(model).patcher.stats.apply_calls == applies and binding_state(model).stats.bind_calls == 2
    fused = bind(model, [FuseSpec(loras["ffn"][0], 1.0, "transformer")], [])
    restored = bind(model, [], [])
    assert restored.restored == fused.written > 0 and binding_state(model).patcher.patched == set()
    assert_model_bit_identical(before, model)


def test_changing_one_strength_rewrites_only_that_loras_tensors(make_model, loras):
    model = make_model()
    attn_path, attn, _ = loras["attn"]
    ffn_path, ffn, _ = loras["ffn"]
    bind(model, [FuseSpec(attn_path, 1.0, "transformer"), FuseSpec(ffn_path, 1.0, "transformer")], [])
    report = bind(model, [FuseSpec(attn_path, 1.0, "transformer"), FuseSpec(ffn_path, 0.5, "transformer")], [])
    assert binding_state(model).patcher.last_written == {f"transformer:{m}.weight" for m in ffn}
    assert (report.written, report.restored) == (len(ffn), 0)
    # dropping the ffn LoRA restores exactly its tensors
    report = bind(model, [FuseSpec(attn_path, 1.0, "transformer")], [])
    assert (report.written, report.restored) == (0, len(ffn))


def test_a_bad_file_anywhere_means_no_weight_is_written(make_model, loras, tmp_path, make_transformer):
    model = make_model()
    bind(model, [FuseSpec(loras["ffn"][0], 1.0, "transformer")], [])
    before = snapshots(model)
    # a LoRA whose to_q delta has the FFN's shape: accounting refuses it before anything is written
    wrong = make_targets(make_transformer(), ["blocks.0.ffn.net.0.proj"], seed=23)
    bad = write_diffusers_lora(tmp_path / "bad.safetensors",
                               {"blocks.0.attn1.to_q": wrong["blocks.0.ffn.net.0.proj"]})
    fuses = [FuseSpec(loras["attn"][0], 1.0, "transformer"), FuseSpec(bad, 1.0, "transformer_2")]
    with pytest.raises(KeyMatchError, match="bad.safetensors"):
        bind(model, fuses, [])
    with pytest.raises(KeyMatchError, match="component 'transformer_3'"):
        bind(model, [FuseSpec(loras["attn"][0], 1.0, "transformer_3", "attn.safetensors")], [])
    assert_model_bit_identical(before, model)
    assert binding_state(model).fuses == (FuseSpec(loras["ffn"][0], 1.0, "transformer"),)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_interrupt_mid_bind_restores_then_unbind_is_bit_exact(make_model, loras, dtype):
    model = make_model(dtype)
    base = snapshots(model)
    bind(model, [FuseSpec(loras["attn"][0], 1.0, "transformer")], [])
    bound = snapshots(model)
    calls = {"n": 0}

    def check_interrupt():
        calls["n"] += 1
        if calls["n"] == 4:
            raise InterruptedError("stop")

    with pytest.raises(InterruptedError):
        bind(model, [FuseSpec(loras["attn"][0], 0.3, "transformer"), FuseSpec(loras["ffn"][0], 1.0, "transformer_2")],
             [], check_interrupt=check_interrupt)
    assert calls["n"] == 4
    assert_model_bit_identical(bound, model)
    unbind(model)
    assert_model_bit_identical(base, model)
    assert binding_state(model).patcher.patched == set()


def test_unknown_keys_refuse_unless_lenient(make_model, loras, tmp_path):
    from safetensors.torch import load_file, save_file

    tensors = load_file(loras["ffn"][0])
    tensors["transformer.blocks.0.not_a_layer.lora_A.weight"] = torch.zeros(2, 24)
    tensors["transformer.blocks.0.not_a_layer.lora_B.weight"] = torch.zeros(24, 2)
    path = str(tmp_path / "extra_keys.safetensors")
    save_file(tensors, path)
    model = make_model()
    before = snapshots(model)
    with pytest.raises(KeyMatchError, match="extra_keys.safetensors: 2 key"):
        bind(model, [FuseSpec(path, 1.0, "transformer")], [])
    assert_model_bit_identical(before, model)
    report = bind(model, [FuseSpec(path, 1.0, "transformer")], [], lenient=True)
    accounting = report.fuses[0]["accounting"]
    assert accounting["counts"]["unmatched"] == 2 and accounting["warnings"]
    assert report.written == len(loras["ffn"][1])
