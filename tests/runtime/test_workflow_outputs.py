"""Every committed workflow renders the same data in ``lorabind run`` and ``lorabind serve``, and close to a small
float reference recorded once.

Why not hashes: an output hash encodes which vector kernels PyTorch picked on the recording machine (AVX2 and
AVX-512 sum in different orders), and a lossy codec (WebP) spreads one flipped 8-bit value over many pixels.
So the decoded tensors are captured *before* encoding, by wrapping the savers, and compared:

- ``run`` against ``serve``, live, in this process: the same kernels, so the tensors must be identical;
- against ``workflow_output_references.json``: each output pooled to a few hundred floats (block means of the
  frames, chunk means of the audio), within a tolerance per compute dtype (``TOLERANCE``);
- a bf16/fp8 workflow, where a different kernel order changes the output far more than the fp32 ones, is
  checked by invariants instead: shape, finiteness, range, and agreement with the same workflow computed in
  float32 (``BF16_VS_FP32``); the float32 rerun is the one held to the reference.

``.ci/run`` runs this file a second time under ``ATEN_CPU_CAPABILITY=avx2`` to prove the references hold on
both kernel families. To re-record after an intended numerical change:
``LORABIND_RECORD_OUTPUT_REFERENCES=1 pytest tests/runtime/test_workflow_outputs.py``.
"""

from __future__ import annotations

import inspect
import json
import os
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import torch
from PIL import Image, ImageSequence

import lorabind
from lorabind.nodes import minimax_nodes, output_nodes, video_nodes
from lorabind.runtime.cli import main

pytestmark = pytest.mark.slow

WORKFLOWS = Path(lorabind.__file__).parent / "workflows" / "api"
REFERENCES_FILE = Path(__file__).with_name("workflow_output_references.json")
RECORD = os.environ.get("LORABIND_RECORD_OUTPUT_REFERENCES") == "1"
# comfy_*: ComfyUI-native examples (core loaders and samplers): they run in real ComfyUI only
# (tests/nodes/test_comfy_native_real.py); headless they are refused, naming ComfyUI
NAMES = sorted(path.name[: -len(".api.json")] for path in WORKFLOWS.glob("*.api.json")
               if not path.name.startswith("comfy_"))
# Refused by design: a 4-step distill pair sampled with 20 steps.
FAILING = {"wan22_mismatched_contract": "is a 4-step distill LoRA: steps must be 4, got 20"}
# Computed in bfloat16 (fp8 or GGUF weights): kernel order moves single values by up to ~0.2, so the bf16 output
# gets invariants only, against a float32 rerun of the same workflow (the loader node's ``dtype`` input); that
# float32 rerun is what is checked against the reference.
BF16_WORKFLOWS = {"wan22_single_files_fp8": "1.dtype=float32", "wan22_gguf_lightx2v": "1.dtype=float32"}
# The float32 rerun of an fp8 workflow still moves by up to 1.2e-3 between AVX2 and AVX-512 (measured; its fp8
# text encoder keeps fp8 weights), so its reference tolerance is FP8_TOLERANCE. The GGUF example's float32 rerun
# is an fp32 workflow (Q8_0 dequantises exactly in float32, its LoRA patches sum in float32): TOLERANCE.
FP8_TOLERANCE = 5e-3
FP8_WORKFLOWS = ("wan22_single_files_fp8",)
# Largest difference between a pooled fp32 output and its reference. AVX2 and AVX-512 runs differ by about
# 1e-6 per value (measured on the tiny models); a real change (a LoRA strength 1.0 -> 0.9) moves pooled values
# by 1e-3 or more, so 1e-4 keeps both margins wide.
TOLERANCE = 1e-4
# Largest mean absolute difference between a bf16 workflow's frames and the same workflow in float32 (values in
# [0, 1]). Measured on the tiny fp8 Wan2.2 set: 0.0019 on AVX-512 kernels, 0.0072 on AVX2; the same workflow
# with another seed differs by 0.031, so 0.015 sits at twice the noise and half a real change.
BF16_VS_FP32 = 0.015
POOL = 8  # frames are averaged over POOL x POOL pixel blocks; audio over 64 chunks


class OutputCapture:
    """Wraps the image, audio and video savers so that every tensor handed to them is kept, keyed by what it is
    and the file prefix (``images:``, ``audio:``, and ``video:`` / ``soundtrack:`` for the video saver)."""

    SAVERS = ((output_nodes, "LoraBindSaveImage", {"images": "images"}),
              (minimax_nodes, "LoraBindSaveAudio", {"audio": "audio"}),
              (video_nodes, "LoraBindSaveVideo", {"images": "video", "audio": "soundtrack"}))

    def __init__(self, monkeypatch):
        self.outputs: dict[str, torch.Tensor] = {}
        for module, cls_name, kinds in self.SAVERS:
            cls = getattr(module, cls_name)
            monkeypatch.setattr(cls, "save", self._wrap(cls.save, kinds))

    def _wrap(self, save, kinds):
        signature = inspect.signature(save)

        def capturing_save(node, *args, **kwargs):
            arguments = signature.bind(node, *args, **kwargs).arguments
            prefix = arguments.get("filename_prefix", "")
            for name, kind in kinds.items():
                value = arguments.get(name)
                if value is not None:
                    tensor = value["waveform"] if isinstance(value, dict) else value
                    self.outputs[f"{kind}:{prefix}"] = tensor.detach().to(torch.float32).clone()
            return save(node, *args, **kwargs)
        return capturing_save

    def take(self) -> dict[str, torch.Tensor]:
        taken, self.outputs = self.outputs, {}
        return taken


def pooled(tensor: torch.Tensor) -> list[float]:
    """A few hundred floats that follow the output closely: block means of each frame, chunk means of audio."""
    if tensor.dim() == 4:  # IMAGE: frames, height, width, channels
        frames = tensor.permute(0, 3, 1, 2)
        return torch.nn.functional.avg_pool2d(frames, POOL, ceil_mode=True).flatten().tolist()
    flat = tensor.flatten()
    return torch.stack([chunk.mean() for chunk in flat.chunk(64)]).tolist()


def describe(outputs: dict[str, torch.Tensor]) -> dict:
    return {key: {"shape": list(value.shape), "pooled": [round(v, 7) for v in pooled(value)]}
            for key, value in sorted(outputs.items())}


@pytest.fixture(scope="module")
def models_root(tmp_path_factory):
    """One models root with every built-in tiny model and fixture LoRA, shared by run and serve."""
    from lorabind.tiny_models import build_tiny

    root = tmp_path_factory.mktemp("output_models")
    build_tiny(root)
    return root


@pytest.fixture(scope="module")
def references():
    if RECORD:
        recorded: dict = {}
        yield recorded
        REFERENCES_FILE.write_text(json.dumps(recorded, indent=1, sort_keys=True) + "\n")
        return
    yield json.loads(REFERENCES_FILE.read_text())


@pytest.fixture(scope="module")
def server(models_root, tmp_path_factory):
    from lorabind.runtime.server import ServerConfig
    from lorabind.runtime.server.in_process_server import BackgroundServer

    out = tmp_path_factory.mktemp("output_serve")
    config = ServerConfig(port=0, models_root=str(models_root), output_dir=str(out / "output"),
                          input_dir=str(out / "input"), temp_dir=str(out / "temp"))
    srv = BackgroundServer(config).start()
    yield srv
    srv.stop()


def run_workflow(name, models_root, tmp_path, capsys, *sets: str) -> tuple[int, str, Path]:
    out = tmp_path / f"output{len(sets)}"
    args = ["run", str(WORKFLOWS / f"{name}.api.json"), "--models", str(models_root), "--output", str(out),
            "--input", str(tmp_path / "input")]
    for item in sets:
        args += ["--set", item]
    code = main(args)
    return code, capsys.readouterr().err, out


def serve_prompt(url: str, prompt: dict, timeout: float = 300.0) -> dict:
    """POST one prompt to a running ``lorabind serve`` and return its finished history entry."""
    deadline = time.monotonic() + timeout
    with urllib.request.urlopen(urllib.request.Request(
            f"{url}/prompt", data=json.dumps({"prompt": prompt}).encode(),
            headers={"Content-Type": "application/json"})) as response:
        prompt_id = json.load(response)["prompt_id"]
    while time.monotonic() < deadline:
        with urllib.request.urlopen(f"{url}/history/{prompt_id}") as response:
            history = json.load(response)
        if prompt_id in history:
            return history[prompt_id]
        time.sleep(0.05)
    raise AssertionError(f"prompt {prompt_id} did not finish within {timeout} s")


def assert_written_files_match(out: Path, outputs: dict[str, torch.Tensor]) -> None:
    """The files on disk hold what was captured: frame count and size of each image and video (never the codec's
    bytes), one WAV per waveform, a sound stream in each video given a soundtrack."""
    images = sorted(p for p in out.rglob("*") if p.suffix in (".png", ".webp"))
    found = []
    for path in images:
        with Image.open(path) as image:
            found.append((sum(1 for _ in ImageSequence.Iterator(image)), *image.size))
    assert sorted(found) == captured_sizes(outputs, "images:")
    videos = sorted(p for p in out.rglob("*") if p.suffix in (".mp4", ".webm"))
    assert sorted(video_frames_and_size(path) for path in videos) == captured_sizes(outputs, "video:")
    assert sum(video_has_sound(path) for path in videos) == len(captured_sizes(outputs, "soundtrack:"))
    wavs = list(out.rglob("*.wav"))
    assert len(wavs) == sum(v.shape[0] for k, v in outputs.items() if k.startswith("audio:"))


def captured_sizes(outputs: dict[str, torch.Tensor], kind: str) -> list[tuple]:
    """(frames, width, height) of each captured IMAGE of this kind; for a soundtrack, its shape."""
    captured = [value for key, value in sorted(outputs.items()) if key.startswith(kind)]
    return sorted((v.shape[0], v.shape[2], v.shape[1]) if v.dim() == 4 else tuple(v.shape) for v in captured)


def video_frames_and_size(path: Path) -> tuple[int, int, int]:
    import av

    with av.open(str(path)) as container:
        decoded = list(container.decode(video=0))
    return len(decoded), decoded[0].width, decoded[0].height


def video_has_sound(path: Path) -> bool:
    import av

    with av.open(str(path)) as container:
        return len(container.streams.audio) == 1


def assert_matches_reference(name: str, outputs: dict[str, torch.Tensor], reference: dict) -> None:
    tolerance = FP8_TOLERANCE if name in FP8_WORKFLOWS else TOLERANCE
    got = describe(outputs)
    assert sorted(got) == sorted(reference), f"{name}: outputs {sorted(got)} != reference {sorted(reference)}"
    for key, entry in got.items():
        assert entry["shape"] == reference[key]["shape"], key
        worst = max(abs(a - b) for a, b in zip(entry["pooled"], reference[key]["pooled"]))
        assert worst <= tolerance, f"{name} {key}: pooled output differs from the reference by {worst:.3g}"


def assert_bf16_agrees_with_fp32(name, outputs, fp32_outputs) -> None:
    assert sorted(outputs) == sorted(fp32_outputs)
    for key, value in outputs.items():
        assert value.shape == fp32_outputs[key].shape and torch.isfinite(value).all(), key
        assert value.min() >= 0.0 and value.max() <= 1.0, key
        gap = (value - fp32_outputs[key]).abs().mean().item()
        assert gap <= BF16_VS_FP32, f"{name} {key}: bf16 differs from float32 by {gap:.3g} on average"


def test_every_workflow_has_a_reference(references):
    if not RECORD:
        assert sorted(references) == [name for name in NAMES if name not in FAILING]


@pytest.mark.parametrize("name", NAMES)
def test_run_and_serve_render_the_same_data(name, models_root, server, references, tmp_path, capsys, monkeypatch):
    capture = OutputCapture(monkeypatch)
    code, err, out = run_workflow(name, models_root, tmp_path, capsys)
    run_outputs = capture.take()
    if code == 0:  # before serve runs: the server writes through the same process-wide output registry
        assert_written_files_match(out, run_outputs)
    prompt = json.loads((WORKFLOWS / f"{name}.api.json").read_text(encoding="utf-8"))
    if name in FAILING:  # both refuse before anything runs: serve at validation, with a 400 naming the file
        assert code == 1 and FAILING[name] in err and run_outputs == {}
        with pytest.raises(urllib.error.HTTPError) as refused:
            serve_prompt(server.url, prompt)
        assert refused.value.code == 400 and FAILING[name] in refused.value.read().decode()
        assert capture.take() == {}
        return
    entry = serve_prompt(server.url, prompt)
    serve_outputs = capture.take()
    messages = dict(entry["status"]["messages"])
    assert code == 0, err
    assert entry["status"]["status_str"] == "success", messages
    assert run_outputs and sorted(run_outputs) == sorted(serve_outputs)
    for key, value in run_outputs.items():
        assert torch.equal(value, serve_outputs[key]), f"{name} {key}: run and serve differ"
    if name in BF16_WORKFLOWS:
        code, err, _ = run_workflow(name, models_root, tmp_path, capsys, BF16_WORKFLOWS[name])
        assert code == 0, err
        fp32_outputs = capture.take()
        assert_bf16_agrees_with_fp32(name, run_outputs, fp32_outputs)
        run_outputs = fp32_outputs
    if RECORD:
        references[name] = describe(run_outputs)
    else:
        assert_matches_reference(name, run_outputs, references[name])
