"""``lorabind serve`` talks: one line per prompt queued / started / finished or failed (naming the node), what
the sampler bound, what Ctrl-C is doing; and a body without the ``{"prompt": …}`` wrapper is told the shape."""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from lorabind.runtime.server.prompt_log import bind_summaries
from server_client import Client, run_async
from server_fake_nodes import count_and_save


def server_lines(caplog):
    return [r.getMessage() for r in caplog.records if r.name == "lorabind.server"]


def test_a_failed_prompt_logs_a_line_naming_the_node(server, caplog):
    caplog.set_level(logging.INFO, logger="lorabind.server")

    async def body():
        client = Client(server.url)
        try:
            await client.connect()
            failing = (await client.queue_prompt({"7": {"class_type": "SrvFail", "inputs": {"value": 3}}}))["prompt_id"]
            await client.wait_done(failing)
            working = (await client.queue_prompt(count_and_save(steps=2)))["prompt_id"]
            await client.wait_done(working)
            return failing, working
        finally:
            await client.close()

    failing, working = run_async(body)
    lines = server_lines(caplog)
    assert f"prompt {failing} queued (#0, 1 node, client client-a)" in lines
    assert f"prompt {failing} started" in lines
    (failed,) = [line for line in lines if line.startswith(f"prompt {failing} failed")]
    assert failed.startswith(f"prompt {failing} failed at node 7 (SrvFail) after ")
    assert failed.endswith(" s: ValueError: SrvFail refuses value 3")
    assert f"prompt {working} queued (#1, 2 nodes, client client-a)" in lines
    assert any(line.startswith(f"prompt {working} finished in ") for line in lines)


def test_the_bind_summary_names_what_each_sampler_bound():
    outputs = {"6": {"lorabind_schedule": [{"bind": {"fuses": [{}, {}], "adapters": [], "written": 132,
                                                      "restored": 0}}]}, "8": {"images": []}}
    assert bind_summaries(outputs) == ["node 6 bound 2 fused LoRA(s) and 0 adapter(s) (132 model parameters "
                                       "written, 0 restored)"]


def test_an_api_json_file_posted_as_is_is_told_the_body_shape(server):
    async def body():
        client = Client(server.url)
        try:
            return await client.post("/prompt", count_and_save())
        finally:
            await client.close()

    status, answer = run_async(body)
    assert status == 400 and answer["error"]["type"] == "no_prompt"
    assert answer["error"]["message"] == "No prompt provided"  # ComfyUI's; the details say what to send
    assert answer["error"]["details"] == (
        'This body looks like a workflow file sent as it is; the body must be {"prompt": <API prompt or UI '
        'workflow>, "client_id": "<your id>"} (client_id is optional; it routes the WebSocket messages to you)')


def test_stopping_says_it_interrupts_the_running_prompt(tmp_path, caplog):
    from server_client import start_server

    caplog.set_level(logging.INFO, logger="lorabind.server")
    server = start_server(tmp_path)

    async def body():
        client = Client(server.url)
        try:
            await client.connect()
            pid = (await client.queue_prompt(count_and_save(steps=50, delay=0.2)))["prompt_id"]
            while (await client.receive())["type"] != "progress":
                pass
            return pid
        finally:
            await client.close()

    pid = run_async(body)
    started = time.monotonic()
    server.stop()
    assert time.monotonic() - started < 8.0
    assert f"shutting down: interrupting the running prompt {pid} at node 1" in server_lines(caplog)
    assert any(line.startswith(f"prompt {pid} interrupted at node 1 (SrvCountSteps)") for line in server_lines(caplog))


@pytest.mark.slow
@pytest.mark.skipif(sys.platform == "win32", reason="SIGINT")
def test_ctrl_c_stops_lorabind_serve_promptly_and_says_so(tmp_path):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    package_parent = str(Path(__file__).resolve().parents[3])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [package_parent, os.environ.get("PYTHONPATH")]))}
    proc = subprocess.Popen([sys.executable, "-m", "lorabind.runtime.cli", "serve", "--port", str(port),
                             "--models", str(tmp_path / "models"), "--output", str(tmp_path / "out")],
                            cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 300  # a first start builds the examples before it answers
        while time.monotonic() < deadline:
            try:  # an answer, not a connection: the port is bound before the examples are built
                urllib.request.urlopen(f"http://127.0.0.1:{port}/system_stats", timeout=1).close()
                break
            except OSError:
                assert proc.poll() is None, proc.stderr.read()
                time.sleep(0.2)
        proc.send_signal(signal.SIGINT)
        started = time.monotonic()
        out, err = proc.communicate(timeout=30)
        assert time.monotonic() - started < 10
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert "shutting down (no prompt running)" in err and err.rstrip().endswith("lorabind serve: stopped")


def test_every_prompt_gets_one_line_in_order_refusals_included_and_queued_before_started(server, caplog):
    """Issue 45 item 8: a prompt refused with a 400 left no line, and "started" could come before "queued" (the
    worker took the prompt before the handler logged it)."""
    from lorabind.runtime.server.composition_root import STATE_KEY

    caplog.set_level(logging.INFO, logger="lorabind.server")
    queue = server.app[STATE_KEY].queue
    put = queue.put
    logged_at_put = []

    def recording_put(item, *args, **kwargs):
        logged_at_put.append((item.prompt_id, list(server_lines(caplog))))
        return put(item, *args, **kwargs)

    queue.put = recording_put

    async def body():
        client = Client(server.url)
        try:
            await client.connect()
            first = (await client.queue_prompt(count_and_save(steps=1)))["prompt_id"]
            refused = await client.post("/prompt", {"prompt": {"9": {"class_type": "NoSuchNode", "inputs": {}}},
                                                    "client_id": client.client_id})
            shapeless = await client.post("/prompt", {"nothing": 1})
            last = (await client.queue_prompt(count_and_save(steps=1)))["prompt_id"]
            await client.wait_done(first)
            await client.wait_done(last)
            return first, refused, shapeless, last
        finally:
            queue.put = put
            await client.close()

    first, (status, answer), (shapeless_status, _), last = run_async(body)
    assert status == 400 and shapeless_status == 400
    lines = [line for line in server_lines(caplog) if line.startswith("prompt ")]
    per_prompt = [line for line in lines if " queued (" in line or " refused " in line]
    assert len(per_prompt) == 4, per_prompt
    assert per_prompt[0].startswith(f"prompt {first} queued (")
    assert per_prompt[1].startswith("prompt ") and " refused (client client-a): " in per_prompt[1]
    assert answer["error"]["message"] in per_prompt[1]
    assert per_prompt[2] == "prompt refused before validation (no_prompt); the client was told why"
    assert per_prompt[3].startswith(f"prompt {last} queued (")
    for prompt_id, seen in logged_at_put:  # the queued line is written before the worker can see the prompt
        assert any(line.startswith(f"prompt {prompt_id} queued (") for line in seen), prompt_id
    for prompt_id in (first, last):
        assert lines.index(f"prompt {prompt_id} started") > next(
            i for i, line in enumerate(lines) if line.startswith(f"prompt {prompt_id} queued ("))


def test_a_contract_refusal_says_its_sentence_once(tiny_models_root, caplog):
    """Issue 54: the refusal line said the contract sentence twice (the error's details, then the node's)."""
    import json

    import lorabind
    from lorabind.runtime.server import prompt_log
    from prompt_refusals import refused_early

    prompt = json.loads((Path(lorabind.__file__).parent / "workflows" / "api" / "wan22_mismatched_contract.api.json")
                        .read_text())
    result = refused_early(prompt, tiny_models_root)
    caplog.set_level(logging.INFO, logger="lorabind.server")
    prompt_log.refused("p1", result.error, result.node_errors, "c1")
    [line] = server_lines(caplog)
    sentence = "is a 4-step distill LoRA: steps must be 4, got 20"
    assert line.count(sentence) == 1, line
    assert line.endswith("; node 6 (LoraBindSampler): Value breaks a file's sampling contract"), line
