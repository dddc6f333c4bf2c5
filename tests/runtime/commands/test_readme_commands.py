"""Every ``lorabind`` command in the ``bash`` blocks of the README and docs/, run exactly as written from a clone's
folder (issue 30: ``inspect`` and ``merge`` pointed at ``models/loras/wan2.2_…`` while the fixtures live in
``models/loras/lorabind-tiny/``, and failed when copied). Lines with a placeholder (``FILE``, ``DIR``) are
templates, ``serve`` runs until stopped (the server tests cover it), and ``models download`` and the real-size
workflows need the network and real weights (test_models_download.py covers them against a hub on loopback);
everything else must exit 0."""

from __future__ import annotations

import os
import re
import shlex
from pathlib import Path

import pytest

import lorabind
from docs_text import doc_files, shell_commands
from lorabind.runtime import folder_paths
from lorabind.runtime.cli import main

PACK = Path(lorabind.__file__).parent
PLACEHOLDER = re.compile(r"\b[A-Z][A-Z_]{2,}\b")  # FILE, DIR, WORKFLOW: a template, not a command
LONG_RUNNING = ("serve",)
NEEDS_REAL_WEIGHTS = ("lorabind models download", "workflows/real/")


def readme_commands() -> list[str]:
    """The ``lorabind …`` commands of the README's and the docs' ``bash`` blocks, each once."""
    return shell_commands(doc_files())


def runnable(command: str) -> bool:
    return (not PLACEHOLDER.search(command) and shlex.split(command)[1] not in LONG_RUNNING
            and not any(part in command for part in NEEDS_REAL_WEIGHTS))


def test_the_docs_name_the_fixture_folder_in_every_runnable_path():
    commands = [command for command in readme_commands() if runnable(command)]
    assert [shlex.split(c)[1] for c in commands] == [
        "run", "plan", "run", "inspect", "merge", "extract", "plan", "run", "run", "inspect"]
    for command in commands:
        for lora in re.findall(r"models/loras/\S+", command):
            assert lora.startswith("models/loras/lorabind-tiny/"), command


@pytest.mark.slow
def test_the_readme_commands_run_verbatim_in_a_clone(tiny_models_root, tmp_path, monkeypatch, capsys):
    clone = tmp_path / "clone"
    clone.mkdir()
    (clone / "workflows").symlink_to(PACK / "workflows")
    (clone / "models").symlink_to(tiny_models_root)  # what the Quick start's first run built
    monkeypatch.chdir(clone)
    monkeypatch.delenv("LORABIND_MODELS", raising=False)
    for command in filter(runnable, readme_commands()):
        try:
            code = main(shlex.split(command)[1:])
        finally:
            folder_paths.configure()
        out, err = capsys.readouterr()
        assert code == 0, f"{command}\n{err[-2000:]}"
    assert (clone / "merged" / "tiny-wan22-lightx2v-high" / "model_index.json").is_file()
    assert (clone / "extracted.safetensors").is_file()
    assert sorted(os.listdir(clone / "output" / "lorabind"))[:1] == ["wan22_lightx2v_4step_00001_.webp"]


def test_what_the_runnable_commands_write_in_a_clone_is_git_ignored():
    """Issue 54: the tour's outputs (``merged/``, ``extracted.safetensors``) showed as untracked files in the
    clone; every ``--out``/``--output`` of a runnable command lands under a path ``.gitignore`` names."""
    ignored = [line.strip() for line in (PACK / ".gitignore").read_text(encoding="utf-8").splitlines()
               if line.startswith("/")]
    outputs = []
    for command in filter(runnable, readme_commands()):
        words = shlex.split(command)
        outputs += [words[i + 1] for i, word in enumerate(words[:-1]) if word in ("--out", "--output")]
    assert {"merged/tiny-wan22-lightx2v-high", "extracted.safetensors"} <= set(outputs)
    for output in outputs:
        top = output.split("/")[0]
        assert f"/{top}/" in ignored or f"/{top}" in ignored, (output, ignored)
