"""The commands the README, CONTRIBUTING.md and docs/ show, read out of their Markdown: for the docs test (each
parses) and the README commands test (the runnable ones run verbatim in a clone)."""

from __future__ import annotations

import re
from pathlib import Path

import lorabind

PACK = Path(lorabind.__file__).parent
FENCED = re.compile(r"^```[^\n]*\n(.*?)^```", re.S | re.M)
INLINE_CODE = re.compile(r"`([^`]+)`")
# `lorabind ...`, with a shell prompt or a venv's bin/ folder before it
COMMAND = re.compile(r"^(?:\$ )?(?:\S*/bin/)?lorabind(?: +(.*))?$")


def is_command(line: str) -> bool:
    """A ``lorabind`` command line; ``lorabind run: node 6 ...`` is a command's output, not a command."""
    found = COMMAND.match(line)
    return bool(found) and not (found.group(1) or "").split(" ", 1)[0].endswith(":")


def doc_files(root: Path = PACK) -> list:
    """The front door, the contributor's guide and every page of the docs tree."""
    return [root / "README.md", root / "CONTRIBUTING.md", *sorted((root / "docs").rglob("*.md"))]


def _block_commands(block: str) -> list:
    """A fenced block's commands: continuation lines (a trailing backslash, or an indented line right after a
    command, as the synopsis wraps) joined, ``&&`` chains split, trailing comments dropped."""
    commands, previous_was_command = [], False
    for line in block.replace("\\\n", " ").splitlines():
        if previous_was_command and line.startswith(" ") and line.strip():
            commands[-1] += " " + line.strip()
            continue
        previous_was_command = False
        for part in line.split(" && "):
            part = part.split("  #", 1)[0].strip()
            if is_command(part):
                commands.append(part)
                previous_was_command = True
    return commands


def commands_in(text: str) -> list:
    """Every ``lorabind`` command of a Markdown text: in fenced blocks, and in inline code spans outside them."""
    commands = [command for block in FENCED.findall(text) for command in _block_commands(block)]
    prose = FENCED.sub("", text)
    spans = (" ".join(span.split()) for span in INLINE_CODE.findall(prose))
    return commands + [span for span in spans if is_command(span)]


def shell_commands(paths: list) -> list:
    """The ``lorabind`` commands of the pages' ``bash`` blocks (what a reader copies into a shell), each once, in
    page order, the program's own path dropped (``.venv/bin/lorabind run X`` is ``lorabind run X``)."""
    commands = []
    for path in paths:
        for block in re.findall(r"^```bash\n(.*?)^```", path.read_text(encoding="utf-8"), re.S | re.M):
            commands += ["lorabind " + (COMMAND.match(c).group(1) or "") for c in _block_commands(block)]
    return list(dict.fromkeys(commands))
