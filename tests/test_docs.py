"""The README, CONTRIBUTING.md and docs/ stay true to the code (issue 41): every ``lorabind`` command they show
names a subcommand whose ``--help`` works and only flags that subcommand's parser has, and every relative link
leads to a file (and, with ``#anchor``, to a heading of it).

Why in-process: the parser is built once from ``runtime/cli.py`` and asked for each command, instead of one
``lorabind --help`` process per command (each would pay the interpreter's start). Each check takes its input as an
argument, so a companion test feeds it a breach."""

from __future__ import annotations

import argparse
import contextlib
import io
import re
from pathlib import Path

import pytest

from docs_text import FENCED, PACK, commands_in, doc_files
from lorabind.runtime.cli import build_parser
from lorabind.runtime.parallel.options import parallel_spec

FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def _subcommands(parser: argparse.ArgumentParser) -> dict | None:
    """The parser's subcommand table (name -> parser), None when it takes no subcommand."""
    found = [action for action in parser._actions if isinstance(action, argparse._SubParsersAction)]
    return found[0].choices if found else None


def _subcommand_path(parser: argparse.ArgumentParser, words: list) -> tuple:
    """``(path, parser)``: the subcommand words a command names (``["models", "build-tiny"]``) and the parser of
    the last one, None when a word names no subcommand."""
    path, current = [], parser
    for word in words:
        table = _subcommands(current)
        if word.startswith("-") or table is None:
            break
        path.append(word)
        current = table.get(word)
        if current is None:
            break
    return path, current


def _help_exit_code(parser: argparse.ArgumentParser, path: list) -> int:
    """What ``lorabind PATH --help`` exits with (0: the subcommand exists and its help prints)."""
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        try:
            parser.parse_args([*path, "--help"])
        except SystemExit as exit_:
            return int(exit_.code or 0)
    return 0


def command_problems(text: str, parser: argparse.ArgumentParser) -> list:
    """One line per command of ``text`` that does not parse: a subcommand whose ``--help`` fails, or a flag its
    parser does not have. ``lorabind run/serve`` names two subcommands; each is checked."""
    problems = []
    for command in commands_in(text):
        words = command.split("lorabind", 1)[1].split()
        for first in (words[0].split("/") if words and not words[0].startswith("-") else [None]):
            path, sub = _subcommand_path(parser, ([first] if first else []) + words[1:])
            if _help_exit_code(parser, path) != 0 or sub is None:
                problems.append(f"{command!r}: `lorabind {' '.join(path)} --help` fails")
                continue
            unknown = [flag for flag in FLAG.findall(command) if flag not in sub._option_string_actions]
            problems += [f"{command!r}: {flag} is not a flag of `lorabind {' '.join(path)}`" for flag in unknown]
    return problems


def headings(path: Path) -> set:
    """GitHub's anchors of a Markdown file's headings (lower case, punctuation dropped, spaces to hyphens)."""
    text = FENCED.sub("", path.read_text(encoding="utf-8"))
    titles = re.findall(r"^#{1,6} +(.+?) *$", text, re.M)
    return {re.sub(r"[^\w\- ]", "", title.lower()).replace(" ", "-") for title in titles}


def link_problems(path: Path) -> list:
    """One line per relative link of ``path`` that leads nowhere: a missing file, or an anchor that is no heading
    of the Markdown file it names (web links are not followed)."""
    problems = []
    for target in LINK.findall(FENCED.sub("", path.read_text(encoding="utf-8"))):
        if re.match(r"[a-z]+:", target):
            continue
        file_part, _, anchor = target.partition("#")
        linked = (path.parent / file_part).resolve() if file_part else path
        if not linked.exists():
            problems.append(f"{path.name}: {target} (no such file)")
        elif anchor and linked.suffix == ".md" and anchor not in headings(linked):
            problems.append(f"{path.name}: {target} (no heading #{anchor} in {linked.name})")
    return problems


@pytest.fixture(scope="module")
def parser():
    return build_parser()


def test_every_command_in_the_readme_and_docs_parses(parser):
    commands = {(path, command) for path in doc_files() for command in commands_in(path.read_text(encoding="utf-8"))}
    assert len(commands) > 40, sorted(commands)  # the extraction found the docs' commands, not nothing
    named = {" ".join(_subcommand_path(parser, c.split("lorabind", 1)[1].split())[0]) for _, c in commands}
    assert {"run", "inspect", "merge", "extract", "serve", "plan", "models build-tiny", "models check"} <= named
    problems = [f"{path.relative_to(PACK)}: {problem}" for path in doc_files()
                for problem in command_problems(path.read_text(encoding="utf-8"), parser)]
    assert problems == []


def test_a_stale_subcommand_or_flag_in_a_page_is_reported(parser):
    page = ("```bash\nlorabind build-tiny --models DIR\nlorabind inspect FILE --json  # fine\n```\n"
            "Run `lorabind run WORKFLOW.json --no-such-flag` or `lorabind run/serve --device cuda`.\n"
            "```\nlorabind serve [--port 8188]\n      [--replica-count N]\nlorabind run: node 6 failed\n```\n")
    assert command_problems(page, parser) == [
        "'lorabind build-tiny --models DIR': `lorabind build-tiny --help` fails",
        "'lorabind serve [--port 8188] [--replica-count N]': --replica-count is not a flag of `lorabind serve`",
        "'lorabind run WORKFLOW.json --no-such-flag': --no-such-flag is not a flag of `lorabind run`"]


def test_every_relative_link_resolves():
    assert [problem for path in doc_files() for problem in link_problems(path)] == []


def test_a_link_to_a_missing_file_or_heading_is_reported(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "page.md").write_text("# A page\n\n## HTTP/WebSocket API\n\n```bash\n# not a heading\n```\n")
    readme = tmp_path / "README.md"
    readme.write_text("[ok](docs/page.md#httpwebsocket-api) [web](https://example.com/x.md) [self](#front)\n"
                      "# Front\n[gone](docs/moved.md) [anchor](docs/page.md#not-a-heading)\n"
                      "```\n[in code](nowhere.md)\n```\n")
    assert link_problems(readme) == ["README.md: docs/moved.md (no such file)",
                                     "README.md: docs/page.md#not-a-heading (no heading #not-a-heading in page.md)"]


def test_the_readme_is_a_front_door_with_the_two_setup_commands_ci_runs():
    readme = (PACK / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= 400
    quick_start = readme.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    setup = [line for block in FENCED.findall(quick_start) for line in block.splitlines()
             if line.startswith("python3 -m venv")]
    assert len(setup) == 2 and "lorabind run example_workflows/wan22_lightx2v_4step.json" in setup[0]
    installation = (PACK / "docs" / "getting-started" / "installation.md").read_text(encoding="utf-8")
    assert all(f"\n{command}\n" in installation for command in setup)  # the page that explains them, verbatim
    ci = PACK / ".ci" / "run"
    if not ci.is_file():
        pytest.skip("no .ci/run beside this copy of the pack")
    install, test = setup[1].rsplit(" && ", 1)
    assert install in ci.read_text() and f"\n{test}\n" in ci.read_text()


def test_several_gpus_names_the_guide_flags_run_and_serve_accept(parser):
    """``run`` and ``serve`` take the serving guide's spellings (``--parallel``'s degrees)."""
    page = (PACK / "docs" / "serving" / "several-gpus.md").read_text(encoding="utf-8")
    assert "`lorabind run` and `lorabind serve` accept the guide's flags" in page
    for flag in ("--tensor-parallel-size", "--ulysses-degree", "--ring-degree", "--cfg-parallel-size"):
        assert f"`{flag} N`" in page
        assert parser.parse_args(["run", "wf.json", flag, "2"]).command == "run"
        assert parallel_spec(parser.parse_args(["serve", flag, "2"])).world_size == 2
