"""The MiniMax-H3 sampler: tasks and partitions, keyframes, cfg, determinism, progress/interrupt, decode, WAV, and
the tiny builders' determinism."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import wave
from pathlib import Path

import pytest
import torch

import lorabind
from engine_probes import read_wav_comment
from lorabind.loaders.contracts.sigmas import shifted_sigmas
from lorabind.loaders.dispatch.contract_discovery import ResolvedSchedule
from lorabind.loaders.errors import LoraBindError
from lorabind.loaders.families.minimax_h3 import FAMILY, references, sampling
from lorabind.loaders.families.minimax_h3 import pipeline as S
from lorabind.loaders.io.wav_files import write_wav
from lorabind.nodes import NODE_CLASS_MAPPINGS
from lorabind.runtime.executor import PromptExecutor

SCHEDULE = ResolvedSchedule(sigmas=shifted_sigmas(3, 12.0), audio_sigmas=shifted_sigmas(3, 3.0), steps=3, cfg=1.0,
                            shift=12.0, task="t2va")


class Forwards:
    """Counts forwards per partition and records the row timesteps and video row counts they get."""

    def __init__(self, model):
        self.calls = []
        self.hooks = [module.register_forward_pre_hook(
            lambda m, args, kwargs, name=name: self.calls.append(
                (name, kwargs["timestep"].tolist(), kwargs["hidden_states"].shape[1])), with_kwargs=True)
            for name, module in model.components.items()]

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        for hook in self.hooks:
            hook.remove()


@pytest.fixture(scope="module")
def prompts(mm_models):
    model = mm_models["plain"]
    return S.encode_prompt(model, "a dog runs in the city"), S.encode_prompt(model, "blurry")


@pytest.mark.slow
def test_same_seed_same_result_other_seed_differs(mm_models, prompts):
    model = mm_models["plain"]
    latent = S.empty_latents(model, 32, 32, 2)
    first = FAMILY.sampling.denoise(model, prompts[0], None, latent, SCHEDULE, 5)
    again = FAMILY.sampling.denoise(model, prompts[0], None, latent, SCHEDULE, 5)
    other = FAMILY.sampling.denoise(model, prompts[0], None, latent, SCHEDULE, 6)
    assert torch.equal(first.samples, again.samples) and torch.equal(first.extra["audio"], again.extra["audio"])
    assert not torch.equal(first.samples, other.samples)


@pytest.mark.parametrize("cfg, per_step", [(1.0, 1), (4.0, 2)])
def test_cfg_one_runs_one_forward_per_step(mm_models, prompts, cfg, per_step):
    model = mm_models["plain"]
    with Forwards(model) as seen:
        FAMILY.sampling.denoise(model, *prompts, S.empty_latents(model, 32, 32, 1), dataclasses.replace(SCHEDULE, cfg=cfg), 0)
    assert [name for name, _, _ in seen.calls] == ["transformer"] * (3 * per_step)


def test_rows_carry_one_minus_sigma_for_video_and_audio(mm_models, prompts):
    model = mm_models["plain"]
    with Forwards(model) as seen:
        FAMILY.sampling.denoise(model, prompts[0], None, S.empty_latents(model, 32, 32, 1), SCHEDULE, 0)
    for step, (_, timesteps, _) in enumerate(seen.calls):
        expected = sorted({1 - SCHEDULE.sigmas[step], 1 - SCHEDULE.audio_sigmas[step]})
        assert timesteps == pytest.approx(expected, abs=1e-6)


def test_ref2va_runs_on_transformer_ref(mm_models, prompts):
    model = mm_models["plain"]
    latent = references.with_references(model, S.empty_latents(model, 32, 32, 1), torch.rand(1, 32, 32, 3))
    assert S.implied_task(latent) == "ref2va"
    with Forwards(model) as seen:
        out = FAMILY.sampling.denoise(model, prompts[0], None, latent, dataclasses.replace(SCHEDULE, task="ref2va"), 0)
    assert [name for name, _, _ in seen.calls] == ["transformer_ref"] * 3
    assert all(rows == 16 + 16 for _, _, rows in seen.calls)  # one 32x32 reference (16 rows) + 16 generated rows
    assert out.samples.shape == (1, 4, 1, 8, 8)


def test_fl2va_keyframe_rows_are_held_near_clean(mm_models, prompts):
    model = mm_models["plain"]
    latent = S.empty_latents(model, 32, 32, 2)
    anchored = S.with_first_frame(model, latent, torch.rand(1, 32, 32, 3, generator=torch.Generator().manual_seed(1)))
    assert S.implied_task(anchored) == "fl2va" and S.implied_task(latent) is None
    with Forwards(model) as seen:
        out = FAMILY.sampling.denoise(model, prompts[0], None, anchored, dataclasses.replace(SCHEDULE, task="fl2va"), 0)
    rows_per_frame = (8 // 2) * (8 // 2)
    assert all(rows == 3 * rows_per_frame for _, _, rows in seen.calls)  # 1 keyframe + 2 generated frames
    assert all(0.999 in [round(t, 6) for t in timesteps] for _, timesteps, _ in seen.calls)
    assert out.samples.shape == latent.samples.shape
    with pytest.raises(LoraBindError, match="anchored on a first frame, which is task fl2va"):
        FAMILY.sampling.denoise(model, prompts[0], None, anchored, SCHEDULE, 0)
    with pytest.raises(LoraBindError, match="task fl2va needs a first-frame keyframe"):
        FAMILY.sampling.denoise(model, prompts[0], None, latent, dataclasses.replace(SCHEDULE, task="fl2va"), 0)
    with pytest.raises(LoraBindError, match="the first frame is 16x16 but the latent is for 32x32"):
        S.with_first_frame(model, latent, torch.rand(1, 16, 16, 3))


def test_check_inputs_refuses_before_any_forward(mm_models, prompts):
    """The weight-free checks a sampler runs before binding: each names what is wrong, and no forward happens."""
    model = mm_models["plain"]
    latent = S.empty_latents(model, 32, 32, 1)
    no_audio = dataclasses.replace(latent, extra={k: v for k, v in latent.extra.items() if k != "audio"})
    cases = [
        (prompts[0], None, latent, dataclasses.replace(SCHEDULE, cfg=4.0), "cfg=4 needs a negative conditioning"),
        (prompts[0], None, no_audio, SCHEDULE, "the latent carries no MiniMax-H3 audio latents"),
        (prompts[0], None, latent, dataclasses.replace(SCHEDULE, audio_sigmas=(1.0, 0.0)),
         "video and audio schedules differ in length"),
        (prompts[0], None, latent, dataclasses.replace(SCHEDULE, task="fl2va"), "task fl2va needs a first-frame"),
        (prompts[0], None, latent, dataclasses.replace(SCHEDULE, task="ref2va"),
         "task ref2va needs reference images .*without them the run would be text-only"),
        (prompts[0], None, references.with_references(model, latent, torch.rand(1, 32, 32, 3)), SCHEDULE,
         "the latent carries reference images, which is task ref2va, but the schedule was resolved for t2va"),
    ]
    with Forwards(model) as seen:
        for positive, negative, lat, schedule, message in cases:
            with pytest.raises(LoraBindError, match=message):
                sampling.check_inputs(model, positive, negative, lat, schedule)
            with pytest.raises(LoraBindError, match=message):
                FAMILY.sampling.denoise(model, positive, negative, lat, schedule, 0)
    assert seen.calls == []


def test_progress_and_interrupt_between_steps(mm_models, prompts):
    model = mm_models["plain"]
    steps_seen = []

    class Stop(Exception):
        pass

    def interrupt():
        if len(steps_seen) == 2:
            raise Stop

    with pytest.raises(Stop):
        FAMILY.sampling.denoise(model, prompts[0], None, S.empty_latents(model, 32, 32, 1), SCHEDULE, 0,
                  on_step=lambda i, total: steps_seen.append((i, total)), check_interrupt=interrupt)
    assert steps_seen == [(1, 3), (2, 3)]


def test_decode_video_frames_and_stereo_audio(mm_models, prompts):
    model = mm_models["plain"]
    latent = S.empty_latents(model, 32, 16, 3, audio_seconds=0.5)
    out = FAMILY.sampling.denoise(model, prompts[0], None, latent, SCHEDULE, 0)
    frames = S.decode(model, out)
    audio = S.decode_audio(model, out)
    assert frames.shape == (3, 16, 32, 3) and 0.0 <= frames.min() and frames.max() <= 1.0
    assert audio["sample_rate"] == 320 and audio["waveform"].shape == (1, 2, 20 * 8)  # 0.5 s x 40 latents x hop 8
    assert audio["waveform"].abs().max() <= 1.0 and not torch.equal(audio["waveform"][0, 0], audio["waveform"][0, 1])
    with pytest.raises(LoraBindError, match="multiples of 8"):
        S.empty_latents(model, 36, 32, 1)


def test_wav_round_trip_keeps_samples_and_comment(tmp_path):
    waveform = torch.linspace(-1, 1, 50).repeat(2, 1) * torch.tensor([[1.0], [-0.5]])
    path = tmp_path / "a.wav"
    write_wav(str(path), waveform, 320, {"prompt": {"1": {"class_type": "X"}}, "workflow": {"nodes": []}})
    with wave.open(str(path)) as wav:
        assert (wav.getnchannels(), wav.getframerate(), wav.getnframes()) == (2, 320, 50)
        data = torch.frombuffer(bytearray(wav.readframes(50)), dtype=torch.int16).reshape(50, 2).t()
    torch.testing.assert_close(data.float() / 32767, waveform, atol=1 / 32767, rtol=0)
    assert read_wav_comment(str(path)) == {"prompt": {"1": {"class_type": "X"}}, "workflow": {"nodes": []}}
    umask = os.umask(0)
    os.umask(umask)
    # written through a 0600 temp file, but readable like any file ``open`` creates
    assert path.stat().st_mode & 0o777 == 0o666 & ~umask
    assert [p.name for p in tmp_path.iterdir()] == ["a.wav"]  # no temp file left behind


class NoiseImage:
    """Test-only IMAGE source (the pack has no image loader node): a seeded random picture."""

    CATEGORY = "tests"
    FUNCTION = "make"
    RETURN_TYPES = ("IMAGE",)

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"seed": ("INT", {"default": 0})}}

    def make(self, seed):
        return (torch.rand(1, 32, 32, 3, generator=torch.Generator().manual_seed(seed)),)


@pytest.mark.slow
def test_ref2v_turbo_workflow_runs_on_transformer_ref(mm_registry, mm_models):
    """The ref2v Turbo file with reference images runs on transformer_ref; without them it is refused by name."""
    workflows = Path(lorabind.__file__).parent / "workflows" / "api"
    prompt = json.loads((workflows / "minimax_h3_turbo_4step_768p.api.json").read_text())
    prompt["2"]["inputs"]["lora_name"] = "lorabind-tiny/minimax_h3_ref2v_turbo_4step_v0.1_bf16.safetensors"
    prompt["6"]["inputs"]["shift"] = 12.0
    executor = PromptExecutor(dict(NODE_CLASS_MAPPINGS, NoiseImage=NoiseImage))
    refused = executor.execute(prompt, "ref2v-no-references")
    assert not refused.success and refused.error["node_type"] == "LoraBindSampler"
    assert "task ref2va needs reference images" in refused.error["exception_message"]
    prompt["20"] = {"class_type": "NoiseImage", "inputs": {"seed": 1}}
    prompt["21"] = {"class_type": "MiniMaxReferenceImages",
                    "inputs": {"model": ["1", 0], "latent": ["5", 0], "reference_images": ["20", 0]}}
    prompt["6"]["inputs"]["latent"] = ["21", 0]
    with Forwards(mm_models["plain"]) as seen:
        result = executor.execute(prompt, "ref2v")
    assert result.success, result.error
    assert [name for name, _, _ in seen.calls] == ["transformer_ref"] * 4


def _digest(folder: Path) -> dict:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def _lora_content(path: Path):
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as handle:
        return handle.metadata(), {k: handle.get_tensor(k) for k in handle.keys()}


def test_tiny_builders_are_deterministic_small_and_pinned(tmp_path, mm_root):
    from lorabind.tiny_models.minimax_h3 import build_tiny_minimax_h3, write_minimax_fixture_loras

    folders = build_tiny_minimax_h3(tmp_path)
    write_minimax_fixture_loras(tmp_path)
    for folder in folders:
        assert _digest(folder) == _digest(mm_root / "diffusers" / folder.name)
        assert sum(p.stat().st_size for p in folder.rglob("*") if p.is_file()) < 2 * 1024 * 1024
    # safetensors writes metadata from a Rust HashMap (key order varies per process): compare content, not bytes
    for path in sorted((tmp_path / "loras" / "lorabind-tiny").iterdir()):
        again, first = _lora_content(path), _lora_content(mm_root / "loras" / "lorabind-tiny" / path.name)
        assert again[0] == first[0] and again[1].keys() == first[1].keys()
        assert all(torch.equal(again[1][k], first[1][k]) for k in first[1])
    pinned = json.loads((folders[1] / "model_index.json").read_text())["_minimax_h3"]
    assert pinned["base_schedule"] == [1.0, 0.7, 0.4, 0.15, 0.0]
    assert pinned["sigma_shift_scales"] == {"video": 12.0, "audio": 3.0}
    assert json.loads((folders[0] / "model_index.json").read_text())["_minimax_h3"] == {
        "reference_image_short_edge": 32}  # no base_schedule: the plain folder pins nothing
