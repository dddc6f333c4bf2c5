"""The pack inside real ComfyUI in an older environment (transformers 4, diffusers 0.36), as many ComfyUI
installs still are: it imports, and a family that needs newer libraries is refused with our version message.

The environment is a venv of its own per ComfyUI version, built by ``real-comfyui.sh`` on first use (``COMFY_TRANSFORMERS='<5'``, the
pack's requirements with diffusers pinned); the tiny models are built in it the way a user would, with
``lorabind models build-tiny`` run by that environment's Python.
"""

import json
import os
import subprocess
from pathlib import Path

import pytest

import lorabind
from real_comfyui import COMFY_VERSIONS, REPO_ROOT, RealComfyUI, require_harness

pytestmark = pytest.mark.slow

OLD_DIFFUSERS = "0.36.0"

def _venv(version: str) -> Path:
    """The old environment's venv for ComfyUI ``version`` (0.3.64 keeps the name it had before 0.30.0 came)."""
    suffix = "" if version == COMFY_VERSIONS[0] else f"-comfy{version}"
    return Path.home() / ".cache" / "real-comfyui" / f"venv-transformers4-diffusers{OLD_DIFFUSERS}{suffix}"

VERSION_MESSAGE = f"needs diffusers >= 0.42 (installed {OLD_DIFFUSERS})"


def _build_tiny_in(venv: Path, models: Path, work: Path) -> str:
    """``lorabind models build-tiny`` in ``venv`` (lorabind importable through a link named ``lorabind``)."""
    shim = work / "shim"
    shim.mkdir()
    (shim / "lorabind").symlink_to(REPO_ROOT)
    result = subprocess.run(
        [str(venv / "bin" / "python"), "-m", "lorabind.runtime.cli", "models", "build-tiny", "--models", str(models),
         "--input", str(work / "input")],
        capture_output=True, text=True, timeout=600, cwd=work,
        env={**os.environ, "PYTHONPATH": str(shim), "HF_HUB_OFFLINE": "1", "PYTHONDONTWRITEBYTECODE": "1"})
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    return result.stdout


@pytest.fixture(scope="module")
def old_comfy(tmp_path_factory, comfy_version):
    require_harness()
    work = tmp_path_factory.mktemp("comfy_old_env")
    models = work / "models"
    models.mkdir()
    pip = f"-r {REPO_ROOT / 'requirements.txt'} diffusers=={OLD_DIFFUSERS}"
    venv = _venv(comfy_version)
    with RealComfyUI(work, models, version=comfy_version, venv=venv, pip=pip,
                     env={"COMFY_TRANSFORMERS": "<5"}) as running:
        running.venv_python = venv / "bin" / "python"
        running.build_output = _build_tiny_in(venv, models, work)
        yield running


def test_the_old_environment_is_what_it_claims(old_comfy):
    versions = subprocess.run([str(old_comfy.venv_python), "-c",
                               "import diffusers, transformers; print(diffusers.__version__, transformers.__version__)"],
                              capture_output=True, text=True, check=True).stdout.split()
    assert versions[0] == OLD_DIFFUSERS and versions[1].startswith("4.")
    assert f"skipped tiny-minimax-h3: {VERSION_MESSAGE}" in old_comfy.build_output


@pytest.mark.parametrize("workflow", ["minimax_h3_turbo_8step", "minimax_h3_native", "minimax_h3_pinned"])
def test_a_minimax_prompt_fails_with_our_version_message(old_comfy, workflow):
    prompt = json.loads((Path(lorabind.__file__).parent / "workflows" / "api" / f"{workflow}.api.json").read_text())
    run = old_comfy.run(prompt)
    assert run.status == 200 and run.body["node_errors"] == {}, run.body  # listed, so it passes validation
    error = run.error
    assert error is not None and error["node_type"] == "LoraBindModelLoader", run.messages
    model_name = prompt[error["node_id"]]["inputs"]["model_name"]
    assert error["exception_message"].strip() == (f"the built-in {model_name} {VERSION_MESSAGE}; upgrade with pip to use "
                                          "this model family")
