"""The README's `lorabind plan` sample is what the command prints: each shown line in order (a line of "…"
stands for the lines left out), so the first answer a new user reads is the real one (issue 45 items 1 and 9)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import lorabind
from lorabind.runtime.cli import main

README = Path(lorabind.__file__).parent / "README.md"


def plan_sample() -> tuple[list, list]:
    """(arguments, shown lines) of the README's plan command and the output block after it."""
    text = README.read_text(encoding="utf-8")
    command, output = re.search(r"```bash\nlorabind (plan [^\n]*)\n```\n\n```\n(.*?)\n```", text, re.S).groups()
    return shlex.split(command), output.splitlines()


def test_the_readme_plan_sample_is_what_plan_prints(capsys):
    arguments, shown = plan_sample()
    assert main(arguments) == 0
    printed = capsys.readouterr().out.splitlines()
    position = 0
    for line in shown:
        if line.strip() == "…":
            continue
        assert line in printed[position:], line
        position = printed.index(line, position) + 1
    assert shown[0] == printed[0] and len(shown) >= 4
