"""The issue-4 example workflows run headless through PromptExecutor and the real nodes, plus the graph-level
guarantees: exact branches, no re-fuse on a seed-only re-run, MoE expert routing, refusal before any write."""

import copy
import json
import os
import shutil
from pathlib import Path

import pytest
import torch

import lorabind
from adapters_helpers import assert_same_state, recorded_forwards, state_snapshot
from lorabind.loaders.binding.bind import binding_state, unbind
from lorabind.nodes import NODE_CLASS_MAPPINGS
from lorabind.runtime.executor import PromptExecutor
from lorabind.runtime.workflow_format import to_api_prompt
from lorabind.tiny_models import lora_fixtures as F

pytestmark = pytest.mark.slow  # runs whole workflows / servers end to end

WORKFLOWS = Path(lorabind.__file__).parent / "workflows" / "api"
TEMPLATES = Path(lorabind.__file__).parent / "workflows"
RUNNABLE = ["wan22_lightx2v_4step", "wan21_distill", "qwen_image_lightning", "peft_two_branches",
            "wan22_strength_schedule"]
PUBLISHED_4STEP = [1.0, 0.9375, 0.833333, 0.625, 0.0]  # reference §5.2 (k=5, N=4)
MISMATCH_MESSAGE = f"{os.path.basename(F.WAN22_HIGH)} is a 4-step distill LoRA: steps must be 4, got 20"


def load(name):
    return json.loads((WORKFLOWS / f"{name}.api.json").read_text())


def sampler_ids(prompt):
    return [nid for nid, node in prompt.items() if node["class_type"] == "LoraBindSampler"]


class CaptureLatent:
    """Test-only output node: keeps the sampled latent so branches can be compared bit for bit."""

    captured: dict = {}
    CATEGORY = "tests"
    FUNCTION = "capture"
    OUTPUT_NODE = True
    RETURN_TYPES = ()

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"latent": ("LORABIND_LATENT",), "key": ("STRING", {"default": ""})}}

    def capture(self, latent, key):
        CaptureLatent.captured[key] = latent.samples.clone()
        return {"ui": {"text": [key]}}


@pytest.fixture
def executor(registry):
    return PromptExecutor(dict(NODE_CLASS_MAPPINGS, CaptureLatent=CaptureLatent))


@pytest.mark.parametrize("name", RUNNABLE + ["wan22_mismatched_contract"])
def test_ui_form_converts_to_the_api_form(name, registry):
    ui = json.loads((TEMPLATES / f"{name}.json").read_text())
    converted, detected = to_api_prompt(ui, NODE_CLASS_MAPPINGS)
    api = load(name)
    assert detected == "ui"
    assert {k: (v["class_type"], v["inputs"]) for k, v in converted.items()} == {
        k: (v["class_type"], v["inputs"]) for k, v in api.items()}


@pytest.mark.parametrize("name", RUNNABLE)
def test_example_workflow_runs_headless_and_saves_its_outputs(name, executor, registry):
    prompt = load(name)
    result = executor.execute(prompt, f"run-{name}")
    assert result.success, result.error
    saves = [nid for nid, node in prompt.items() if node["class_type"] == "LoraBindSaveImage"]
    for nid in saves:
        (image,) = result.outputs[nid]["images"]
        saved = Path(registry.get_output_directory()) / image["subfolder"] / image["filename"]
        assert saved.is_file() and saved.stat().st_size > 0
    for nid in sampler_ids(prompt):
        (schedule,) = result.outputs[nid]["lorabind_schedule"]
        assert schedule["overrides"] == [] and schedule["steps"] == prompt[nid]["inputs"]["steps"]


def test_wan22_pair_runs_on_the_contract_schedule_with_high_then_low_expert(executor, load_tiny):
    prompt = load("wan22_lightx2v_4step")
    model = load_tiny("tiny-wan22-t2v")
    with recorded_forwards(model) as calls:
        result = executor.execute(prompt, "hooks")
    assert result.success, result.error
    (schedule,) = result.outputs[sampler_ids(prompt)[0]]["lorabind_schedule"]
    assert schedule["sigmas"] == pytest.approx(PUBLISHED_4STEP, abs=1e-6)
    boundary = model.model_index["boundary_ratio"]
    expected = [("transformer" if s >= boundary else "transformer_2", s * 1000) for s in PUBLISHED_4STEP[:-1]]
    assert [name for name, _ in calls] == [name for name, _ in expected]  # cfg 1: one forward per step
    assert [t for _, t in calls] == pytest.approx([t for _, t in expected], abs=1e-3)
    assert [name for name, _ in expected].count("transformer") == 2  # the published 2 high + 2 low split


def test_mismatched_contract_fails_naming_the_file_before_any_weight_changes(executor, load_tiny):
    model = load_tiny("tiny-wan22-t2v")
    unbind(model)
    before = state_snapshot(model)
    binds_before = binding_state(model).stats.bind_calls
    result = executor.execute(load("wan22_mismatched_contract"), "mismatch")
    assert not result.success
    assert result.error["node_type"] == "LoraBindSampler"
    assert result.error["exception_message"].startswith(MISMATCH_MESSAGE)
    assert binding_state(model).stats.bind_calls == binds_before
    assert_same_state(before, model)
    note = next(n for n in json.loads((TEMPLATES / "wan22_mismatched_contract.json").read_text())["nodes"]
                if n["type"] == "Note")
    assert MISMATCH_MESSAGE in note["widgets_values"][0]


def test_enforce_contract_off_runs_the_mismatch_and_reports_the_override(executor):
    prompt = load("wan22_mismatched_contract")
    sampler = sampler_ids(prompt)[0]
    prompt[sampler]["inputs"].update(enforce_contract=False, steps=6)
    result = executor.execute(prompt, "override")
    assert result.success, result.error
    (schedule,) = result.outputs[sampler]["lorabind_schedule"]
    assert schedule["steps"] == 6 and len(schedule["sigmas"]) == 7
    assert f"steps=6 overrides {os.path.basename(F.WAN22_HIGH)} (steps=4 in its contract)" in schedule["overrides"]


def test_seed_only_rerun_reexecutes_only_the_sampler_and_downstream_without_refusing(executor, load_tiny):
    prompt = load("wan22_lightx2v_4step")
    first = executor.execute(prompt, "first")
    assert first.success, first.error
    state = binding_state(load_tiny("tiny-wan22-t2v"))
    fuse_passes, written = state.stats.fuse_passes, state.stats.tensors_written
    sampler = sampler_ids(prompt)[0]
    second_prompt = copy.deepcopy(prompt)
    second_prompt[sampler]["inputs"]["seed"] += 1
    second = executor.execute(second_prompt, "second")
    assert second.success, second.error
    downstream = {sampler} | {nid for nid, node in prompt.items()
                              if node["class_type"] in ("LoraBindVAEDecode", "LoraBindSaveImage")}
    assert set(second.executed) == downstream
    assert (state.stats.fuse_passes, state.stats.tensors_written) == (fuse_passes, written)
    assert state.patcher.last_written == set()


def _branch_prompt(model_name, strengths):
    """wan21 + FuseDistillLoRA at each strength, one sampler + CaptureLatent per branch (same seed)."""
    prompt = {k: v for k, v in load("wan21_distill").items() if k in ("1", "2", "3", "4")}
    prompt["1"]["inputs"]["model_name"] = model_name
    for i, strength in enumerate(strengths):
        fuse, sample, capture = f"f{i}", f"s{i}", f"c{i}"
        prompt[fuse] = {"class_type": "FuseDistillLoRA", "inputs": {
            "model": ["1", 0], "lora_name": F.WAN21_DISTILL, "strength": strength, "component": "auto"}}
        prompt[sample] = {"class_type": "LoraBindSampler", "inputs": {
            "model": [fuse, 0], "positive": ["2", 0], "negative": ["3", 0], "latent": ["4", 0], "seed": 7,
            "steps": 4, "cfg": 1.0, "shift": 5.0, "boundary": 0.0, "enforce_contract": True}}
        prompt[capture] = {"class_type": "CaptureLatent", "inputs": {"latent": [sample, 0],
                                                                   "key": f"{model_name}@{strength}"}}
    return prompt


def test_two_branches_equal_fresh_models_with_each_single_fuse(executor, tiny_models_root, registry):
    for copy_name in ("tiny-wan21-fresh-a", "tiny-wan21-fresh-b"):
        target = tiny_models_root / "diffusers" / copy_name
        if not target.exists():
            shutil.copytree(tiny_models_root / "diffusers" / "tiny-wan21-t2v", target)
    CaptureLatent.captured.clear()
    result = executor.execute(_branch_prompt("tiny-wan21-t2v", (1.0, 0.5)), "branches")
    assert result.success, result.error
    assert executor.execute(_branch_prompt("tiny-wan21-fresh-a", (1.0,)), "fresh-a").success
    assert executor.execute(_branch_prompt("tiny-wan21-fresh-b", (0.5,)), "fresh-b").success
    got = CaptureLatent.captured
    assert torch.equal(got["tiny-wan21-t2v@1.0"], got["tiny-wan21-fresh-a@1.0"])
    assert torch.equal(got["tiny-wan21-t2v@0.5"], got["tiny-wan21-fresh-b@0.5"])
    assert not torch.equal(got["tiny-wan21-t2v@1.0"], got["tiny-wan21-t2v@0.5"])


def test_sampler_reports_each_step_and_stops_at_an_interrupt_between_steps(executor, load_tiny):
    import threading

    prompt = load("wan22_lightx2v_4step")
    sampler = sampler_ids(prompt)[0]
    model = load_tiny("tiny-wan22-t2v")
    interrupt, progress = threading.Event(), []

    def on_event(name, data):
        if name == "progress" and data["node"] == sampler and data["max"] == 4:  # steps (not fuse layers)
            progress.append((data["value"], data["max"]))
            if data["value"] == 2:
                interrupt.set()

    with recorded_forwards(model) as calls:
        result = executor.execute(prompt, "interrupt-sampler", on_event=on_event, interrupt_event=interrupt)
    assert not result.success and result.interrupted
    assert progress == [(1, 4), (2, 4)]
    assert [name for name, _ in calls] == ["transformer", "transformer"]  # the two high-noise steps; nothing after the interrupt
    assert sampler not in result.executed


def test_sampler_reports_fuse_layers_as_work_and_only_steps_as_progress(executor, load_tiny):
    """ComfyUI clients read every ``progress`` message as a sampling step: the fuse layers go out as
    ``progress_state`` (per-node progress, labelled), the steps alone as ``progress``."""
    from lorabind.loaders.binding.bind import unbind

    prompt = load("wan21_distill")
    sampler = sampler_ids(prompt)[0]
    unbind(load_tiny("tiny-wan21-t2v"))  # a cold fuse: every layer of the LoRA is patched in this run
    events = []
    result = executor.execute(prompt, "fuse-progress", on_event=lambda name, data: events.append((name, data)))
    assert result.success
    steps = [(d["value"], d["max"]) for name, d in events if name == "progress"]
    assert steps == [(1, 4), (2, 4), (3, 4), (4, 4)] and all(d["node"] == sampler for n, d in events if n == "progress")
    work = [d["nodes"][sampler] for name, d in events if name == "progress_state"]
    total = work[-1]["max"]
    assert total > 4 and [(w["value"], w["max"]) for w in work] == [(i, total) for i in range(1, total + 1)]
    assert {(w["label"], w["state"], w["node_id"], w["prompt_id"]) for w in work} == {
        ("binding LoRA layers", "running", sampler, "fuse-progress")}
    names = [name for name, _ in events]
    assert names.index("progress_state") < names.index("progress")  # binding, then the steps

    # the same sampler without the LoRA only restores the fused layers: its work is named for that
    prompt["6"]["inputs"]["model"] = ["1", 0]
    events.clear()
    assert executor.execute(prompt, "restore-progress", on_event=lambda name, data: events.append((name, data))).success
    labels = {d["nodes"][sampler]["label"] for name, d in events if name == "progress_state" and sampler in d["nodes"]}
    assert labels == {"restoring base weights"}
    assert [(d["value"], d["max"]) for name, d in events if name == "progress"] == [(1, 4), (2, 4), (3, 4), (4, 4)]


def test_model_loader_reports_placing_components_as_work_never_as_steps(executor, tmp_path):
    """A fresh load places each component: labelled work (``progress_state``), so no client counts it as a step."""
    from lorabind.loaders.models import store as model_store

    model_store.clear_cache()
    events = []
    result = executor.execute(load("wan21_distill"), "load-progress",
                              on_event=lambda name, data: events.append((name, data)))
    assert result.success
    loader_work = [d["nodes"]["1"] for name, d in events if name == "progress_state" and "1" in d["nodes"]]
    assert loader_work and {w["label"] for w in loader_work} == {"placing model components"}
    assert loader_work[-1]["value"] == loader_work[-1]["max"] > 1
    assert {d["node"] for name, d in events if name == "progress"} == {"6"}  # only the sampler's steps
