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
from lorabind.runtime.scale_out.outputs import keep_only, place_files, rename_in_ui, take_files

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
    renamed = place_files(files, front)
    assert renamed == {("output", "sub", "clip_00001_.webp"): "clip_00002_.webp"}
    assert (tmp_path / "front" / "sub" / "clip_00001_.webp").read_bytes() == b"an earlier prompt's file"
    assert (tmp_path / "front" / "sub" / "clip_00002_.webp").read_bytes() == b"new frames"
    assert rename_in_ui(ui, renamed)["images"][0]["filename"] == "clip_00002_.webp"
    assert ui["images"][0]["filename"] == "clip_00001_.webp"  # the original payload is not modified


def test_a_cached_answer_carries_its_own_bytes_again_under_a_fresh_name(tmp_path):
    """Issue 60, item 1: the same prompt again is answered from the replica's output cache, naming the file its
    first run wrote. On main the replica had deleted it after carrying it, so nothing was carried and the answer
    named whatever the front held under that name: here, another prompt's file."""
    replica = {"output": str(tmp_path / "replica"), "temp": str(tmp_path / "replica-temp")}
    front = {"output": str(tmp_path / "front"), "temp": str(tmp_path / "front-temp")}
    (tmp_path / "replica").mkdir()
    (tmp_path / "replica" / "a_00001_.png").write_bytes(b"prompt A's image")
    (tmp_path / "replica" / "stale_00001_.png").write_bytes(b"an evicted entry's image")
    take_files({"images": [{"filename": "stale_00001_.png", "subfolder": "", "type": "output"}]}, replica)  # its run
    (tmp_path / "replica" / "b_00001_.png.part").write_bytes(b"a prompt running beside it, still writing")
    ui = {"images": [{"filename": "a_00001_.png", "subfolder": "", "type": "output"}]}
    first = place_files(take_files(ui, replica), front)  # the first run
    keep_only([ui], replica)  # after it: the cache still holds prompt A's entry, not the stale one
    assert not (tmp_path / "replica" / "stale_00001_.png").exists()
    (tmp_path / "front" / "a_00001_.png").write_bytes(b"prompt B's image, written since")  # the name is reused
    again = place_files(take_files(ui, replica), front)  # the replay of the cached entry
    name = rename_in_ui(ui, again)["images"][0]["filename"]
    assert first == {("output", "", "a_00001_.png"): "a_00001_.png"} and name != "a_00001_.png"
    assert (tmp_path / "front" / name).read_bytes() == b"prompt A's image"
    keep_only([], replica)  # the cache dropped the entry: so does the replica
    assert [p.name for p in (tmp_path / "replica").iterdir()] == ["b_00001_.png.part"]  # never carried: not ours


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


def test_the_fingerprint_counts_only_the_part_a_replica_must_hold_fused(registry, tiny_models_root, tmp_path):
    """A user's plain low-rank LoRA runs on its prompt's own rows of a batch: two prompts over the same distill
    pair that differ only in it reach the same replica. A file with diffs (another distill) does not."""
    import copy

    from engine_helpers import style_lora

    model_dir = tiny_models_root / "diffusers" / "tiny-wan22-t2v"
    registry.add_model_folder_path("loras", str(tmp_path))
    for name, seed in (("ink", 5), ("neon", 6)):
        style_lora(model_dir, "transformer", seed, tmp_path / f"{name}.safetensors")
    classes, base = _node_classes(), _pair_prompt()

    def with_fuse(lora_name: str) -> dict:
        prompt = copy.deepcopy(base)
        prompt["90"] = {"class_type": "FuseDistillLoRA", "inputs": {
            "model": ["5", 0], "lora_name": lora_name, "strength": 0.7, "component": "transformer"}}
        prompt["6"]["inputs"]["model"] = ["90", 0]
        return prompt

    shared = binding_fingerprint(base, classes)
    assert binding_fingerprint(with_fuse("ink.safetensors"), classes) == shared
    assert binding_fingerprint(with_fuse("neon.safetensors"), classes) == shared
    other_distill = "lorabind-tiny/wan2.1_t2v_14b_lora_rank64_lightx2v_4step.safetensors"
    assert binding_fingerprint(with_fuse(other_distill), classes) != shared
