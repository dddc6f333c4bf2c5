"""The scale-out pieces that need no cluster: binding fingerprints, carried output files, Ray imported only
with ``--ray``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import lorabind
from lorabind.runtime.scale_out.fingerprint import binding_fingerprint
from lorabind.runtime.scale_out.outputs import place_files, rename_in_ui, take_files

PACK_DIR = Path(lorabind.__file__).parent


def _pair_prompt() -> dict:
    return json.loads((PACK_DIR / "workflows" / "api" / "wan22_lightx2v_4step.api.json").read_text(encoding="utf-8"))


def _node_classes() -> dict:
    from lorabind.nodes import NODE_CLASS_MAPPINGS

    return NODE_CLASS_MAPPINGS


def _set(prompt: dict, class_type: str, **inputs) -> dict:
    for node in prompt.values():
        if node["class_type"] == class_type:
            node["inputs"].update(inputs)
    return prompt


def test_fingerprint_follows_the_binding_not_the_seed_or_node_ids():
    classes = _node_classes()
    base = binding_fingerprint(_pair_prompt(), classes)
    assert base.startswith("bind-") and len(base) == len("bind-") + 16
    reseeded = _set(_pair_prompt(), "LoraBindSampler", seed=7, steps=8)
    assert binding_fingerprint(reseeded, classes) == base  # sampling settings do not change what is fused
    renumbered = {f"n{key}": node for key, node in _pair_prompt().items()}
    assert binding_fingerprint(renumbered, classes) == base
    weaker = _set(_pair_prompt(), "WanMoELoRAPair", high_noise_strength=0.5)
    assert binding_fingerprint(weaker, classes) != base
    other_dtype = _set(_pair_prompt(), "LoraBindModelLoader", dtype="float32")
    assert binding_fingerprint(other_dtype, classes) != base
    no_model = {"1": {"class_type": "LoraBindSaveImage", "inputs": {"filename_prefix": "x"}}}
    assert binding_fingerprint(no_model, classes) == ""


def test_files_carried_from_a_replica_get_free_names_in_the_front_folder(tmp_path):
    replica = {"output": str(tmp_path / "replica"), "temp": str(tmp_path / "replica-temp")}
    front = {"output": str(tmp_path / "front"), "temp": str(tmp_path / "front-temp")}
    (tmp_path / "replica" / "sub").mkdir(parents=True)
    (tmp_path / "front" / "sub").mkdir(parents=True)
    (tmp_path / "replica" / "sub" / "clip_00001_.webp").write_bytes(b"new frames")
    (tmp_path / "front" / "sub" / "clip_00001_.webp").write_bytes(b"an earlier prompt's file")
    ui = {"images": [{"filename": "clip_00001_.webp", "subfolder": "sub", "type": "output"}], "text": ["x"]}

    files = take_files(ui, replica)
    assert [f["data"] for f in files] == [b"new frames"]
    assert not (tmp_path / "replica" / "sub" / "clip_00001_.webp").exists()  # the replica keeps no copy
    renamed = place_files(files, front)
    assert renamed == {("output", "sub", "clip_00001_.webp"): "clip_00002_.webp"}
    assert (tmp_path / "front" / "sub" / "clip_00001_.webp").read_bytes() == b"an earlier prompt's file"
    assert (tmp_path / "front" / "sub" / "clip_00002_.webp").read_bytes() == b"new frames"
    assert rename_in_ui(ui, renamed)["images"][0]["filename"] == "clip_00002_.webp"
    assert ui["images"][0]["filename"] == "clip_00001_.webp"  # the original payload is not modified


def test_a_carried_file_cannot_leave_the_front_folder(tmp_path):
    files = [{"type": "output", "subfolder": "../../etc", "filename": "x.webp", "data": b"x"}]
    try:
        place_files(files, {"output": str(tmp_path / "front"), "temp": str(tmp_path / "t")})
    except ValueError as exc:
        assert "leaves its folder" in str(exc)
    else:
        raise AssertionError("a subfolder escaping the output folder was accepted")


@pytest.mark.slow
def test_the_single_machine_server_never_imports_ray(tmp_path):
    code = ("import sys; from lorabind.runtime.server import ServerConfig, create_app; "
            f"create_app(ServerConfig(port=0, models_root={str(tmp_path / 'm')!r}, output_dir="
            f"{str(tmp_path / 'o')!r}, input_dir={str(tmp_path / 'i')!r}, temp_dir={str(tmp_path / 't')!r})); "
            "print(sorted(m for m in sys.modules if m == 'ray' or m.startswith('ray.')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip().splitlines()[-1] == "[]"
