"""``lorabind serve`` builds what the example templates name before the editor lists them (issue 30: every
image-to-video template opened with red nodes until a prompt had built its fixture LoRAs and start image)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

import lorabind
from lorabind.runtime.server.example_assets import prepare_example_assets

WORKFLOWS = Path(lorabind.__file__).parent / "workflows" / "api"
TEMPLATES = Path(lorabind.__file__).parent / "workflows"


@pytest.mark.slow  # builds tiny models / imports diffusers in a fresh process
def test_the_templates_files_are_built_once_and_announced(tmp_path):
    served = tmp_path / "workflows"
    served.mkdir()
    for name in ("wan22_lightx2v_4step", "wan22_i2v_lightx2v_4step"):
        shutil.copy(WORKFLOWS / f"{name}.api.json", served)
        shutil.copy(TEMPLATES / f"{name}.json", served)
    models, inputs, said = tmp_path / "models", tmp_path / "input", []
    built = prepare_example_assets(str(served), str(models), str(inputs), announce=said.append)
    assert {"tiny-wan22-t2v", "tiny-wan22-i2v", "lorabind-tiny/start.png"} <= set(built)
    assert (models / "loras" / "lorabind-tiny" /
            "wan2.2_i2v_A14b_high_noise_lora_rank64_lightx2v_4step_1022.safetensors").is_file()
    assert (inputs / "lorabind-tiny" / "start.png").is_file()
    assert len(said) == 1 and said[0].startswith("building the built-in tiny models tiny-wan22-t2v, tiny-wan22-i2v")
    assert said[0].endswith("for the example templates the editor lists")
    # nothing missing: nothing built, nothing said
    assert prepare_example_assets(str(served), str(models), str(inputs), announce=said.append) == []
    assert len(said) == 1
