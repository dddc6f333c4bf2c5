"""Issue 44 item 8: ``from lorabind import Generator``. The README's example (vllm-omni's offline I2V recipe with
the lightx2v pair) runs as written; the API refuses what a workflow refuses, with the same error types; single
files load; and the import stays cheap and installs no host (the pack is ComfyUI's entry)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import lorabind
from lorabind.loaders.errors import ContractError, LoraBindError
from lorabind.tiny_models import lora_fixtures as F

README = Path(lorabind.__file__).parent / "README.md"


def _readme_example() -> str:
    """The README's Python block (the one importing Generator)."""
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), re.S)
    (example,) = [block for block in blocks if "from lorabind import Generator" in block]
    return example


def test_the_readme_example_runs_as_written(tiny_models_root, tmp_path, monkeypatch, capsys):
    from wan_i2v_helpers import example_input_dir

    (tmp_path / "models").symlink_to(tiny_models_root, target_is_directory=True)
    (tmp_path / "input").symlink_to(example_input_dir(), target_is_directory=True)
    monkeypatch.chdir(tmp_path)
    scope: dict = {}
    exec(compile(_readme_example(), "README.md", "exec"), scope)
    video = scope["video"]
    assert len(video.frames) == 5 and video.frames[0].size == (32, 32)
    assert video.schedule["shift"] == 12.0 and video.schedule["experts"] == ["transformer"] * 3 + ["transformer_2"]
    assert [c["source"] for c in video.schedule["contracts"]] == [Path(F.WAN22_I2V_HIGH).name,
                                                                    Path(F.WAN22_I2V_LOW).name]
    assert (tmp_path / "output" / "i2v_lightx2v.webp").stat().st_size > 0
    # issue 54: it said nothing when it worked; it prints what the README says it prints
    printed = capsys.readouterr().out.strip()
    said = re.search(r"It prints `(.*?)`", README.read_text(encoding="utf-8")).group(1)
    assert printed == said == "wrote output/i2v_lightx2v.webp: 5 frames, 4 steps, shift 12.0"


@pytest.fixture(scope="module")
def pair(tiny_models_root):
    from lorabind import Generator

    root = tiny_models_root
    return Generator(root / "diffusers" / "tiny-wan22-t2v").bind_distill(root / "loras" / F.WAN22_HIGH,
                                                                        root / "loras" / F.WAN22_LOW)


def test_the_pairs_contract_holds_and_its_values_are_the_defaults(pair):
    with pytest.raises(ContractError, match=r"lightx2v_4step_1217\.safetensors is a 4-step distill LoRA: steps "
                                            r"must be 4, got 8"):
        pair.generate("a fox", steps=8, height=32, width=32)
    with pytest.raises(ContractError, match=r"cfg"):
        pair.generate("a fox", guidance_scale=3.5, height=32, width=32)
    result = pair.generate("a fox", height=32, width=32, num_frames=1, seed=1)  # 4 steps, shift 5, cfg 1 declared
    assert (result.schedule["steps"], result.schedule["shift"], result.schedule["cfg"]) == (4, 5.0, 1.0)
    assert len(result.images) == 1


def test_a_swapped_pair_is_refused_with_the_swap_message(tiny_models_root):
    from lorabind import Generator

    generator = Generator(tiny_models_root / "diffusers" / "tiny-wan22-t2v")
    with pytest.raises(LoraBindError, match=r"the pair is swapped"):
        generator.bind_distill(tiny_models_root / "loras" / F.WAN22_LOW, tiny_models_root / "loras" / F.WAN22_HIGH)


def test_single_files_and_an_adapter_with_a_strength(tiny_models_root):
    from lorabind import Generator
    from lorabind.tiny_models.single_files import write_tiny_single_files

    write_tiny_single_files(tiny_models_root)
    files = tiny_models_root
    generator = Generator.from_files(
        files / "diffusion_models" / "lorabind-tiny" / "wan2.1_t2v_tiny_bf16.safetensors",
        vae=files / "vae" / "lorabind-tiny" / "wan_2.1_vae_tiny.safetensors",
        text_encoder=next((files / "text_encoders" / "lorabind-tiny").glob("umt5*_bf16.safetensors")))
    styled = generator.add_adapter(files / "loras" / F.PEFT_FOLDER, strength=0.5)
    result = styled.generate("a fox", steps=2, guidance_scale=1.0, height=32, width=32, seed=3)
    assert result.schedule["steps"] == 2 and len(result.frames) == 1


def test_import_lorabind_stays_cheap_and_the_api_installs_no_host():
    code = ("import sys, lorabind; assert 'torch' not in sys.modules; "
            "from lorabind.usecases import host; lorabind.Generator; "
            "assert host._services['folder_paths'] is None, 'a host was installed'; print('ok')")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr
