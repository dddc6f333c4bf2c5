"""``lorabind serve --parallel ulysses=2`` on two CPU ranks over gloo: the ComfyUI API client and the ``openai``
client get the single-process output; an interrupt stops both ranks; a LoRA only one rank cannot read fails the
prompt naming that rank, and both ranks go on serving.

One served job for the module: its two ranks run the command itself (``runtime.cli.main``) in spawned processes, as
torchrun would start them, with the savers wrapped to write each decoded tensor they are handed to a file, so the
outputs are compared as floats before any 8-bit encoding. Measured on this machine (2 cores, one thread per rank,
the single process on 2): max |difference| 1.2e-7 for both clients on the tiny Qwen-Image Lightning template
(the bound asserted is 1e-6, as for ``run --parallel``); the two ranks' outputs are equal.

Why a second LoRA folder per rank: the same name (``rank_only.safetensors``) is a good file in rank 0's
``--allow-lora-dir`` and unreadable bytes in rank 1's, the way a file goes bad on one machine of a job. chmod
cannot make a file unreadable to root, which these tests may run as.
"""

from __future__ import annotations

import base64
import io
import json
import shutil
import time
import urllib.request
from pathlib import Path

import pytest
import torch
from PIL import Image

import lorabind
from gloo_ranks import RANK_TIMEOUT_S
from lorabind.loaders.models.store import clear_cache
from lorabind.runtime.cli import main
from lorabind.runtime.parallel.launch import free_port
from optional_extras import deferred, requires
from saver_capture import capturing_savers
from served_jobs import ServedJob, served_job
from server_client import Client, run_async

openai = deferred("openai")
pytestmark = [requires("openai"), pytest.mark.slow, pytest.mark.filterwarnings("ignore::DeprecationWarning")]

WORKFLOWS = Path(lorabind.__file__).parent / "workflows" / "api"
TEMPLATE = WORKFLOWS / "qwen_image_lightning.api.json"
LIGHTNING = "lorabind-tiny/Qwen-Image-Lightning-4steps-V1.0.safetensors"
TOLERANCE = 1e-6


@pytest.fixture(scope="module")
def root(tiny_models_root, tmp_path_factory):
    """The models root, and per rank a LoRA folder holding ``rank_only.safetensors``: rank 0's a copy of the
    Lightning LoRA, rank 1's bytes no safetensors reader takes."""
    root = tmp_path_factory.mktemp("serve_parallel")
    for rank, write in enumerate((lambda path: shutil.copy(tiny_models_root / "loras" / LIGHTNING, path),
                                  lambda path: path.write_bytes(b"\xff" * 64))):
        (root / f"loras_r{rank}").mkdir()
        write(root / f"loras_r{rank}" / "rank_only.safetensors")
    return root


@pytest.fixture(scope="module")
def served(tiny_models_root, root):
    port = free_port()
    argv = ["serve", "--port", str(port), "--models", str(tiny_models_root), "--output", str(root / "output"),
            "--input", str(root / "input"), "--temp", str(root / "temp"), "--state-dir", str(root / "state"),
            "--openai-model", f"qwen-image={TEMPLATE}", "--parallel", "ulysses=2"]
    with served_job(port, argv, root / "captures", [str(root / f"loras_r{r}") for r in range(2)]) as job:
        yield job


@pytest.fixture(scope="module")
def single(tiny_models_root, root) -> torch.Tensor:
    """The template's output from one process (2 threads), as the saver was handed it."""
    with capturing_savers() as captured:
        code = main(["run", str(TEMPLATE), "--models", str(tiny_models_root), "--output", str(root / "single"),
                     "--input", str(root / "input")])
    clear_cache()
    assert code == 0
    return next(iter(captured.values()))


def _template(changes: dict | None = None) -> dict:
    """The template with ``{(node, input): value}`` changed."""
    prompt = json.loads(TEMPLATE.read_text())
    for (node, name), value in (changes or {}).items():
        prompt[node]["inputs"][name] = value
    return prompt


async def _run_prompt(job: ServedJob, prompt: dict, interrupt_at_step: int | None = None) -> tuple[dict, list]:
    """Queue ``prompt`` as a ComfyUI client does and wait for the end on the WebSocket (interrupting once the
    sampler reports ``interrupt_at_step``); (its history entry, the messages)."""
    client = Client(job.url, client_id="serve-parallel")
    try:
        await client.connect()
        prompt_id = (await client.queue_prompt(prompt))["prompt_id"]
        seen = []
        while True:
            message = await client.receive(timeout=RANK_TIMEOUT_S)
            data = message.get("data", {})
            if data.get("prompt_id") != prompt_id:
                continue
            seen.append(message)
            if message["type"] == "progress" and data["value"] == interrupt_at_step:
                assert (await client.post("/interrupt", {}))[0] == 200
            if message["type"] == "executing" and data.get("node") is None:
                break
        status, history = await client.get(f"/history/{prompt_id}")
        assert status == 200
        return history[prompt_id], seen
    finally:
        await client.close()


def _difference(output: torch.Tensor, single: torch.Tensor) -> float:
    assert output.shape == single.shape
    return (output - single).abs().max().item()


def test_the_comfyui_client_gets_the_single_process_output_from_both_ranks(served, single):
    before = len(served.captured(0))
    entry, _ = run_async(_run_prompt, served, _template())
    assert entry["status"]["status_str"] == "success", entry["status"]
    ours, theirs = served.captured(0)[before:], served.captured(1)[before:]
    assert len(ours) == len(theirs) == 1  # SPMD: rank 1 ran the prompt too (its files go to a scratch folder)
    difference = _difference(ours[0], single)
    print(f"serve --parallel ulysses=2, ComfyUI client: max |difference| {difference:.3g}")
    assert difference <= TOLERANCE and torch.equal(ours[0], theirs[0])
    saved = entry["outputs"]["8"]["images"][0]
    assert (Path(served.captures).parent / "output" / saved["subfolder"] / saved["filename"]).is_file()


def _free(job: ServedJob) -> None:
    """``POST /free``: every rank drops its cached outputs (a rank that kept them would skip nodes the others run,
    and the ranks would lose step)."""
    request = urllib.request.Request(job.url + "/free", json.dumps({"free_memory": True}).encode(),
                                     {"Content-Type": "application/json"})
    urllib.request.urlopen(request, timeout=30).close()


def test_the_openai_client_gets_the_single_process_output(served, single):
    _free(served)  # the same prompt again: run it, rather than replaying the cached outputs
    before = len(served.captured(0))
    client = openai.OpenAI(base_url=served.url + "/v1", api_key="unused", timeout=RANK_TIMEOUT_S)
    result = client.images.generate(model="qwen-image", prompt="a red car on a street", size="32x32",
                                    extra_body={"seed": 42})
    image = Image.open(io.BytesIO(base64.b64decode(result.data[0].b64_json)))
    assert image.size == (32, 32)
    ours = served.captured(0)[before:]
    assert len(ours) == 1 and len(served.captured(1)) == len(served.captured(0))
    difference = _difference(ours[0], single)
    print(f"serve --parallel ulysses=2, openai client: max |difference| {difference:.3g}")
    assert difference <= TOLERANCE


def test_an_interrupt_stops_both_ranks_and_the_next_prompt_runs(served, single):
    before = [len(served.captured(rank)) for rank in range(2)]
    long_run = _template({("6", "model"): ["1", 0], ("6", "steps"): 200})  # no distill LoRA: any step count
    started = time.monotonic()
    entry, seen = run_async(_run_prompt, served, long_run, 2)
    assert time.monotonic() - started < 60
    assert [m for m in seen if m["type"] == "execution_interrupted"]
    assert entry["status"]["status_str"] == "error"
    assert max(m["data"]["value"] for m in seen if m["type"] == "progress") < 200
    assert [len(served.captured(rank)) for rank in range(2)] == before  # neither rank reached the saver
    _expect_the_template_to_run_on_both_ranks(served, single)


def _expect_the_template_to_run_on_both_ranks(served: ServedJob, single: torch.Tensor) -> None:
    before = [len(served.captured(rank)) for rank in range(2)]
    entry, _ = run_async(_run_prompt, served, _template())
    assert entry["status"]["status_str"] == "success"
    assert [len(served.captured(rank)) for rank in range(2)] == [n + 1 for n in before]
    assert _difference(served.captured(0)[-1], single) <= TOLERANCE
    assert torch.equal(served.captured(0)[-1], served.captured(1)[-1])


def test_a_lora_one_rank_cannot_read_fails_the_prompt_naming_the_rank_and_both_ranks_serve_on(served, single):
    entry, seen = run_async(_run_prompt, served, _template({("5", "lora_name"): "rank_only.safetensors"}))
    assert entry["status"]["status_str"] == "error"
    errors = [m["data"] for m in seen if m["type"] == "execution_error"]
    assert len(errors) == 1
    message = errors[0]["exception_message"]
    print(f"the client's error: {message.strip()}")
    assert "rank 1 of 2 failed at node 5 (FuseDistillLoRA)" in message and "rank_only.safetensors" in message
    assert (errors[0]["node_id"], errors[0]["node_type"]) == ("5", "FuseDistillLoRA")  # the editor marks the node
    _expect_the_template_to_run_on_both_ranks(served, single)


def test_a_contract_refusal_comes_from_rank_0_before_any_rank_runs_the_prompt(served):
    before = [len(served.captured(rank)) for rank in range(2)]

    async def body():
        client = Client(served.url)
        try:
            return await client.post("/prompt", {"prompt": _template({("6", "steps"): 20})})
        finally:
            await client.close()

    status, reply = run_async(body)
    refusal = reply["node_errors"]["6"]["errors"][0]["extra_info"]["lorabind_refusal"]
    assert status == 400 and refusal == "contract_mismatch"
    assert "Qwen-Image-Lightning-4steps-V1.0.safetensors" in reply["error"]["details"]
    assert [len(served.captured(rank)) for rank in range(2)] == before
