"""Every MiniMax-H3 mode runs headless (real nodes, PromptExecutor) to video frames + a WAV; a mismatched request
per rule fails with its named error before any weight changes."""

from __future__ import annotations

import copy
import json
import wave
from pathlib import Path

import pytest
import torch

import lorabind
from engine_probes import read_wav_comment
from lorabind.loaders.binding.bind import unbind
from lorabind.loaders.contracts.sigmas import shift_schedule, shifted_sigmas
from lorabind.nodes import NODE_CLASS_MAPPINGS
from lorabind.runtime.executor import PromptExecutor
from lorabind.runtime.workflow_format import to_api_prompt

pytestmark = pytest.mark.slow  # runs whole workflows / servers end to end

WORKFLOWS = Path(lorabind.__file__).parent / "workflows" / "api"
TEMPLATES = Path(lorabind.__file__).parent / "workflows"
BASE = (1.0, 0.7, 0.4, 0.15, 0.0)
# mode -> (model key, expected video sigmas, expected audio sigmas)
MODES = {
    "minimax_h3_pinned": ("pinned", shift_schedule(BASE, 12.0), shift_schedule(BASE, 3.0)),
    "minimax_h3_turbo_4step_768p": ("plain", shifted_sigmas(4, 6.0), shifted_sigmas(4, 3.0)),
    "minimax_h3_turbo_8step": ("plain", shifted_sigmas(8, 12.0), shifted_sigmas(8, 3.0)),
    "minimax_h3_native": ("plain", shift_schedule(BASE, 12.0), shift_schedule(BASE, 3.0)),
}


def load(name):
    return json.loads((WORKFLOWS / f"{name}.api.json").read_text())


def node_id(prompt, class_type):
    return next(nid for nid, node in prompt.items() if node["class_type"] == class_type)


def weights(model):
    return {f"{c}.{k}": v.detach().clone() for c, m in model.components.items() for k, v in m.state_dict().items()}


@pytest.fixture
def executor(mm_registry):
    return PromptExecutor(dict(NODE_CLASS_MAPPINGS))


@pytest.mark.parametrize("name", sorted(MODES))
def test_ui_form_converts_to_the_api_form(name, mm_registry):
    converted, detected = to_api_prompt(json.loads((TEMPLATES / f"{name}.json").read_text()), NODE_CLASS_MAPPINGS)
    assert detected == "ui"
    assert {k: (v["class_type"], v["inputs"]) for k, v in converted.items()} == {
        k: (v["class_type"], v["inputs"]) for k, v in load(name).items()}


@pytest.mark.parametrize("name", sorted(MODES))
def test_mode_runs_headless_to_video_and_wav_on_its_schedule(name, executor, mm_registry, mm_models):
    prompt = load(name)
    model_key, video_sigmas, audio_sigmas = MODES[name]
    transformer = mm_models[model_key].components["transformer"]
    seen = []
    hook = transformer.register_forward_pre_hook(
        lambda module, args, kwargs: seen.append(kwargs["timestep"].tolist()), with_kwargs=True)
    try:
        result = executor.execute(prompt, f"run-{name}")
    finally:
        hook.remove()
    assert result.success, result.error
    (schedule,) = result.outputs[node_id(prompt, "LoraBindSampler")]["lorabind_schedule"]
    assert schedule["sigmas"] == pytest.approx(list(video_sigmas), abs=1e-6)
    assert schedule["audio_sigmas"] == pytest.approx(list(audio_sigmas), abs=1e-6)
    # cfg 1: one forward per interval; rows carry t = 1 - sigma (audio and video may share a value)
    assert len(seen) == len(video_sigmas) - 1
    for step, timesteps in enumerate(seen):
        expected = {round(1 - video_sigmas[step], 5), round(1 - audio_sigmas[step], 5)}
        assert {round(t, 5) for t in timesteps} == expected

    (image,) = result.outputs[node_id(prompt, "LoraBindSaveImage")]["images"]
    assert (Path(mm_registry.get_output_directory()) / image["subfolder"] / image["filename"]).stat().st_size > 0
    (audio,) = result.outputs[node_id(prompt, "LoraBindSaveAudio")]["audio"]
    wav_path = Path(mm_registry.get_output_directory()) / audio["subfolder"] / audio["filename"]
    with wave.open(str(wav_path)) as wav:
        assert (wav.getnchannels(), wav.getsampwidth(), wav.getframerate()) == (2, 2, 320)
        assert wav.getnframes() == 8 * 8  # 5 frames at 24 fps -> round(5/24*40) = 8 latents, hop 8 samples
    assert read_wav_comment(str(wav_path))["prompt"][node_id(prompt, "LoraBindSampler")]["inputs"]["seed"] == 42


def test_turbo_node_reports_its_contract_in_words(executor, mm_registry):
    prompt = load("minimax_h3_turbo_4step_768p")
    result = executor.execute(prompt, "contract-ui")
    assert result.success, result.error
    ui = result.outputs[node_id(prompt, "MiniMaxTurboSchedule")]
    (contract,) = ui["lorabind_contract"]
    assert (contract["kind"], contract["steps"], contract["sigma_points"], contract["flow_shift"],
            contract["audio_flow_shift"], contract["alpha"], contract["rank"]) == ("turbo", 4, 5, 6.0, 3.0, 128.0, 4)
    # the fixture's rank is 4: alpha 128 / rank 4, times the node's scale 1
    assert (contract["scale"], contract["request_scale"], contract["effective_scale"]) == (32.0, 1.0, 32.0)
    assert "4 denoiser evaluations (5 sigma points), flow_shift=6, audio_flow_shift=3" in ui["text"][0]


MISMATCHES = [
    ("minimax_h3_pinned", {"steps": 5}, "tiny-minimax-h3-pinned pins a distilled sigma schedule"),
    ("minimax_h3_turbo_4step_768p", {"steps": 5},
     "minimax_h3_fl2v_turbo_4step_v1.0_768p_bf16.safetensors is a 4-step artifact and requires steps=4 "
     "(5 sigma points produce 4 denoiser evaluations), got steps=5"),
    ("minimax_h3_turbo_4step_768p", {"shift": 12.0},
     "minimax_h3_fl2v_turbo_4step_v1.0_768p_bf16.safetensors requires flow_shift=6, got flow_shift=12"),
    ("minimax_h3_turbo_4step_768p", {"audio_flow_shift": 5.0},
     "minimax_h3_fl2v_turbo_4step_v1.0_768p_bf16.safetensors requires audio_flow_shift=3"),
    ("minimax_h3_turbo_8step", {"steps": 4},
     "minimax_h3_fl2v_turbo_8step_v1.0_bf16.safetensors is an 8-step artifact and requires steps=8 "
     "(9 sigma points produce 8 denoiser evaluations), got steps=4"),
    ("minimax_h3_native", {"steps": 5}, "uses the distilled interval-count contract: steps must be 4 or omitted, "
                                        "not 5"),
]


@pytest.mark.parametrize("name, change, message", MISMATCHES)
def test_mismatched_request_fails_before_any_weight_changes(name, change, message, executor, mm_models):
    model = mm_models[MODES[name][0]]
    unbind(model)
    before = weights(model)
    prompt = load(name)
    prompt[node_id(prompt, "LoraBindSampler")]["inputs"].update(change)
    result = executor.execute(prompt, "mismatch")
    assert not result.success
    assert result.error["node_type"] == "LoraBindSampler"
    assert message in result.error["exception_message"]
    after = weights(model)
    assert all(torch.equal(before[k], after[k]) for k in before) and before.keys() == after.keys()


def test_task_mismatch_is_refused_at_the_schedule_node(executor, mm_models):
    prompt = load("minimax_h3_turbo_4step_768p")
    prompt[node_id(prompt, "MiniMaxTurboSchedule")]["inputs"]["task"] = "ref2va"
    result = executor.execute(prompt, "task-mismatch")
    assert not result.success and result.error["node_type"] == "MiniMaxTurboSchedule"
    assert "is a fl2v Turbo artifact and serves tasks ['t2va', 'fl2va'], got task='ref2va'" in (
        result.error["exception_message"])


def test_native_on_the_pinned_checkpoint_runs_the_adapter_schedule(executor):
    prompt = load("minimax_h3_native")
    prompt[node_id(prompt, "LoraBindModelLoader")]["inputs"]["model_name"] = "tiny-minimax-h3-pinned"
    result = executor.execute(prompt, "native-on-pinned")
    assert result.success, result.error
    sampler = result.outputs[node_id(prompt, "LoraBindSampler")]
    (schedule,) = sampler["lorabind_schedule"]
    assert schedule["steps"] == 4 and schedule["sigmas"] == pytest.approx(list(shift_schedule(BASE, 12.0)))
    (note,) = schedule["notes"]
    assert note.startswith("schedule of minimax_h3_t2va_flashgen_4step_v1.0_768p_bf16.safetensors (native LoRA")
    assert "overrides tiny-minimax-h3-pinned's pinned base_schedule" in note
    assert f"schedule: {note}" in sampler["text"]


def test_scale_zero_turns_the_adapter_and_its_contract_off(executor):
    prompt = copy.deepcopy(load("minimax_h3_turbo_4step_768p"))
    prompt[node_id(prompt, "MiniMaxTurboSchedule")]["inputs"]["scale"] = 0.0
    prompt[node_id(prompt, "LoraBindSampler")]["inputs"].update(steps=3, shift=5.0)
    result = executor.execute(prompt, "scale-zero")
    assert result.success, result.error
    (schedule,) = result.outputs[node_id(prompt, "LoraBindSampler")]["lorabind_schedule"]
    assert schedule["steps"] == 3 and schedule["sigmas"] == pytest.approx(list(shifted_sigmas(3, 5.0)))


class GrayImage:
    """Test-only IMAGE source (the pack has no image loader node)."""

    CATEGORY = "tests"
    FUNCTION = "make"
    RETURN_TYPES = ("IMAGE",)

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"size": ("INT", {"default": 32})}}

    def make(self, size):
        return (torch.full((1, size, size, 3), 0.5),)


def test_fl2va_first_frame_workflow_holds_the_keyframe_rows(mm_registry, mm_models):
    prompt = load("minimax_h3_turbo_4step_768p")
    prompt[node_id(prompt, "MiniMaxTurboSchedule")]["inputs"]["task"] = "fl2va"
    prompt["20"] = {"class_type": "GrayImage", "inputs": {"size": 32}}
    prompt["21"] = {"class_type": "MiniMaxFirstFrame", "inputs": {"model": ["1", 0], "latent": ["5", 0],
                                                                  "image": ["20", 0]}}
    prompt[node_id(prompt, "LoraBindSampler")]["inputs"]["latent"] = ["21", 0]
    transformer = mm_models["plain"].components["transformer"]
    rows = []
    hook = transformer.register_forward_pre_hook(
        lambda module, args, kwargs: rows.append(kwargs["hidden_states"].shape[1]), with_kwargs=True)
    try:
        result = PromptExecutor(dict(NODE_CLASS_MAPPINGS, GrayImage=GrayImage)).execute(prompt, "fl2va")
    finally:
        hook.remove()
    assert result.success, result.error
    assert rows == [(1 + 5) * 16] * 4  # 1 keyframe + 5 generated latent frames, 16 rows each, 4 steps
    (schedule,) = result.outputs[node_id(prompt, "LoraBindSampler")]["lorabind_schedule"]
    assert schedule["task"] == "fl2va"


@pytest.mark.parametrize("lora_name, scale, expected_sigmas, expected_audio, expected_words", [
    # an fl2v Turbo file on task auto serves t2va and fl2va: the latent decides, and the words say so (issue 44: they
    # said "task=t2va" for a run the sampler conditioned as fl2va)
    ("minimax_h3_fl2v_turbo_8step_v1.0_768p_bf16.safetensors", 1.0, shifted_sigmas(8, 6.0), shifted_sigmas(8, 3.0),
     "task from the latent: t2va or fl2va (the sampler conditions as fl2va when the latent is anchored on a first "
     "frame"),
    ("minimax_h3_t2va_flashgen_4step_v1.0_768p_bf16.safetensors", 1.0, shift_schedule(BASE, 12.0),
     shift_schedule(BASE, 3.0), "task=t2va"),
    ("minimax_h3_fl2v_turbo_4step_v1.0_768p_bf16.safetensors", 0.0, shifted_sigmas(4, 6.0), shifted_sigmas(4, 3.0),
     "scale 0: the adapter is off and its contract is not applied"),
])
def test_schedule_node_outputs(lora_name, scale, expected_sigmas, expected_audio, expected_words, mm_registry,
                               mm_models):
    from lorabind.loaders.families import checkpoint_contracts
    from lorabind.loaders.handles import ModelHandle
    from lorabind.nodes.minimax_nodes import MiniMaxTurboSchedule

    model = mm_models["plain"]
    handle = ModelHandle(model, contracts=checkpoint_contracts(model))
    out = MiniMaxTurboSchedule().attach(handle, f"lorabind-tiny/{lora_name}", scale, "auto")
    new_handle, schedule, sigmas = out["result"]
    assert sigmas.dtype == torch.float32 and sigmas.tolist() == pytest.approx(list(expected_sigmas), abs=1e-6)
    assert schedule.contract.source == lora_name and schedule.contract.scale == scale
    # the SCHEDULE carries both modalities' sigmas (a native file's base_schedule shifted by the checkpoint's 12/3)
    assert schedule.contract.sigmas == pytest.approx(list(expected_sigmas), abs=1e-12)
    assert schedule.contract.audio_sigmas == pytest.approx(list(expected_audio), abs=1e-12)
    (spec,) = new_handle.adapters
    assert (spec.name, spec.scale, spec.component) == (f"lorabind-tiny/{lora_name}", scale, "transformer")
    assert handle.adapters == () and new_handle.model is model  # the input handle is not modified
    assert expected_words in out["ui"]["text"][1]


def test_schedule_node_refuses_files_without_a_contract_and_other_families(mm_registry, mm_models, mm_root):
    from lorabind.loaders.errors import LoraBindError
    from lorabind.loaders.handles import ModelHandle
    from lorabind.nodes.minimax_nodes import MiniMaxTurboSchedule

    source = mm_root / "loras" / "lorabind-tiny" / "minimax_h3_fl2v_turbo_4step_v0.1.safetensors"
    plain = mm_root / "loras" / "my_style_lora.safetensors"
    plain.write_bytes(source.read_bytes())
    try:
        with pytest.raises(LoraBindError, match="my_style_lora.safetensors declares no MiniMax-H3 contract"):
            MiniMaxTurboSchedule().attach(ModelHandle(mm_models["plain"]), plain.name, 1.0, "auto")
    finally:
        plain.unlink()
    wan_like = ModelHandle(type("M", (), {"family": "wan2.1", "name": "tiny-wan21-t2v"})())
    with pytest.raises(LoraBindError, match="model tiny-wan21-t2v is wan2.1"):
        MiniMaxTurboSchedule().attach(wan_like, source.name, 1.0, "auto")


def test_turbo_schedule_lists_the_published_turbo_names(mm_registry):
    spec = NODE_CLASS_MAPPINGS["MiniMaxTurboSchedule"].INPUT_TYPES()
    assert "lorabind-tiny/minimax_h3_fl2v_turbo_4step_v1.0_768p_bf16.safetensors" in spec["required"]["lora_name"][0]
