"""``safe_output``: the one rule for every path a command writes, and ``merge``/``extract``/``build-tiny`` on it.

Each hostile target is made at test time: a user's folder, a FIFO, a device, a symlink leading back into the
source, the base model's own weight file, the current folder."""

from __future__ import annotations

import errno
import hashlib
import os
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from lorabind.runtime.cli import main
from lorabind.tiny_models.lora_fixtures import WAN22_HIGH
from patching_helpers import write_component_folder

WEIGHTS = "diffusion_pytorch_model.safetensors"


def snapshot(folder) -> dict:
    """relative path -> (kind, sha256 or link target) of everything under ``folder``, links not followed."""
    found = {}
    for root, dirs, files in os.walk(folder):
        for name in dirs + files:
            path = os.path.join(root, name)
            relative = os.path.relpath(path, folder)
            if os.path.islink(path):
                found[relative] = ("link", os.readlink(path))
            elif os.path.isfile(path):
                found[relative] = ("file", hashlib.sha256(Path(path).read_bytes()).hexdigest())
            else:
                found[relative] = ("dir", None)
    return found


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    """The tiny Wan2.2 folder and its high-noise fixture LoRA."""
    from lorabind.tiny_models import build_tiny, lora_fixtures

    root = tmp_path_factory.mktemp("safe_output")
    build_tiny(root / "models", names=["tiny-wan22-t2v"])
    written = [str(p) for p in lora_fixtures.write_fixture_loras(root / "models")]
    return {"model": str(root / "models" / "diffusers" / "tiny-wan22-t2v"),
            "lora": next(p for p in written if p.endswith(WAN22_HIGH))}


def _merge(source, out, *extra):
    return main(["merge", "--model", source["model"], "--lora", source["lora"], "--out", str(out), *extra])


def test_merge_overwrite_out_dot_refuses_and_changes_nothing(source, tmp_path, monkeypatch, capsys):
    (tmp_path / "notes.txt").write_text("mine")
    (tmp_path / "project").mkdir()
    before = snapshot(tmp_path)
    monkeypatch.chdir(tmp_path)
    assert _merge(source, ".", "--overwrite") == 1
    assert "is not lorabind's output" in capsys.readouterr().err
    assert snapshot(tmp_path) == before


def test_merge_overwrite_refuses_a_file_a_fifo_and_a_foreign_folder(source, tmp_path, capsys):
    user_file = tmp_path / "a_file"
    user_file.write_text("keep me")
    fifo = tmp_path / "a_fifo"
    os.mkfifo(fifo)
    folder = tmp_path / "a_folder"
    folder.mkdir()
    (folder / "photo.png").write_bytes(b"not a model")
    before = snapshot(tmp_path)
    for target, words in ((user_file, "is a file"), (fifo, "FIFO"), (folder, "not lorabind's output")):
        assert _merge(source, target, "--overwrite") == 1
        assert words in capsys.readouterr().err
    assert snapshot(tmp_path) == before


def test_merge_into_a_symlinked_path_inside_the_source_refuses(source, tmp_path, capsys):
    before = snapshot(source["model"])
    link = tmp_path / "link"
    link.symlink_to(source["model"], target_is_directory=True)
    for out in (link / "merged", link / "transformer" / "merged"):
        assert _merge(source, out) == 1
        assert "lies inside the input" in capsys.readouterr().err
    assert _merge(source, link) == 1  # the link itself
    assert "is a symlink" in capsys.readouterr().err
    assert snapshot(source["model"]) == before


def test_merge_overwrite_replaces_its_own_output_and_an_empty_folder_takes_one(source, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    assert _merge(source, empty) == 0
    assert (empty / ".lorabind-output").is_file() and (empty / "transformer" / WEIGHTS).is_file()
    assert _merge(source, empty, "--overwrite") == 0
    assert sorted(os.listdir(tmp_path)) == ["empty"]  # no temporary left beside it


def fake_model(root: Path, name: str, tensors: dict) -> str:
    return write_component_folder(root, name, tensors)


@pytest.fixture
def pair(tmp_path):
    base = fake_model(tmp_path, "base", {"a.weight": torch.zeros(4, 4)})
    tuned = fake_model(tmp_path, "tuned", {"a.weight": torch.ones(4, 4)})
    return base, tuned


def _extract(base, tuned, out, *extra):
    return main(["extract", "--base", base, "--tuned", tuned, "--rank", "2", "--out", str(out), *extra])


def test_extract_out_inside_base_refuses_and_changes_nothing(pair, tmp_path, capsys):
    base, tuned = pair
    before = snapshot(tmp_path)
    for extra in ((), ("--overwrite",)):
        assert _extract(base, tuned, Path(base) / "transformer" / WEIGHTS, *extra) == 1
        assert "lies inside the input" in capsys.readouterr().err
    link = tmp_path / "into_base"
    link.symlink_to(Path(base) / "transformer", target_is_directory=True)
    assert _extract(base, tuned, link / "lora.safetensors") == 1
    assert "lies inside the input" in capsys.readouterr().err
    link.unlink()
    assert snapshot(tmp_path) == before


def test_extract_refuses_a_foreign_file_and_overwrites_only_its_own(pair, tmp_path, capsys):
    base, tuned = pair
    foreign = tmp_path / "someone_elses.safetensors"
    save_file({"x": torch.ones(2)}, str(foreign))
    before = foreign.read_bytes()
    assert _extract(base, tuned, foreign, "--overwrite") == 1
    assert "is not lorabind's output" in capsys.readouterr().err
    assert foreign.read_bytes() == before
    ours = tmp_path / "ours.safetensors"
    assert _extract(base, tuned, ours) == 0
    assert _extract(base, tuned, ours) == 1
    assert "pass --overwrite" in capsys.readouterr().err
    assert _extract(base, tuned, ours, "--overwrite") == 0


def test_extract_onto_a_folder_or_a_full_disk_exits_cleanly(pair, tmp_path, monkeypatch, capsys):
    base, tuned = pair
    folder = tmp_path / "folder.safetensors"
    folder.mkdir()
    assert _extract(base, tuned, folder) == 1
    assert "is a folder" in capsys.readouterr().err

    import safetensors.torch

    def full_disk(tensors, path, metadata=None):
        Path(path).write_bytes(b"half")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(safetensors.torch, "save_file", full_disk)
    out = tmp_path / "out.safetensors"
    assert _extract(base, tuned, out) == 1
    err = capsys.readouterr().err
    assert "failed, nothing written" in err and "No space left on device" in err and "Traceback" not in err
    assert sorted(os.listdir(tmp_path)) == ["base", "folder.safetensors", "tuned"]


def test_build_tiny_refuses_a_user_folder_carrying_a_builtin_name(tmp_path, capsys):
    mine = tmp_path / "models" / "diffusers" / "tiny-wan21-t2v"
    mine.mkdir(parents=True)
    (mine / "my_weights.safetensors").write_bytes(b"precious")
    assert main(["models", "build-tiny", "--models", str(tmp_path / "models"), "--only", "tiny-wan21-t2v"]) == 1
    assert "not lorabind's output" in capsys.readouterr().err
    assert os.listdir(mine) == ["my_weights.safetensors"]


def test_devices_and_sockets_are_refused_and_a_failed_write_leaves_the_target(tmp_path):
    from lorabind.loaders.io.safe_output import OutputRefusedError, check_output, safe_output

    with pytest.raises(OutputRefusedError, match="device, FIFO or socket"):
        check_output("/dev/null", kind="file")
    target = tmp_path / "out"
    with safe_output(str(target), written_by="test") as staged:
        Path(staged, "a").write_text("first")
    with pytest.raises(RuntimeError, match="injected"):
        with safe_output(str(target), written_by="test", overwrite=True) as staged:
            Path(staged, "a").write_text("second")
            raise RuntimeError("injected")
    assert (target / "a").read_text() == "first"
    assert sorted(os.listdir(tmp_path)) == ["out"]
