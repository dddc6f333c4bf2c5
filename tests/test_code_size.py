"""Size rules of the package's own code (outside ``tests/`` and ``bench/``): no file over 400 lines, no function
over 60 lines. Why a test: short files and functions are the project's quality bar, and a rule nobody checks
drifts (``runtime/workflow_format.py`` had grown to 419 lines before this test)."""

from __future__ import annotations

import ast
from pathlib import Path

import lorabind

PACKAGE_DIR = Path(lorabind.__file__).parent
SOURCE_FOLDERS = ("loaders", "nodes", "runtime", "usecases", "tiny_models")
MAX_FILE_LINES = 400
MAX_FUNCTION_LINES = 60


def oversized(package_dir: Path = PACKAGE_DIR) -> list:
    """``file: N lines`` and ``file:line function: N lines`` for each file and function over its limit; a
    function counts from its ``def`` line to its last line (decorators not counted)."""
    found = []
    files = [package_dir / "__init__.py"] + [p for folder in SOURCE_FOLDERS for p in (package_dir / folder).rglob("*.py")]
    for path in sorted(files):
        text = path.read_text(encoding="utf-8")
        relative = path.relative_to(package_dir)
        lines = len(text.splitlines())
        if lines > MAX_FILE_LINES:
            found.append(f"{relative}: {lines} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    found.append(f"{relative}:{node.lineno} {node.name}: {length} lines")
    return found


def test_the_size_check_sees_a_long_file_and_a_long_function(tmp_path):
    (tmp_path / "__init__.py").write_text("")
    for folder in SOURCE_FOLDERS:
        (tmp_path / folder).mkdir()
    (tmp_path / "runtime" / "long.py").write_text("def f():\n" + "    x = 1\n" * 60 + "\n" * 340 + "y = 2\n")
    assert oversized(tmp_path) == ["runtime/long.py: 402 lines", "runtime/long.py:1 f: 61 lines"]


def test_no_file_over_400_lines_and_no_function_over_60():
    assert oversized() == []
