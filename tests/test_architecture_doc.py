"""``docs/architecture.md`` maps every package: each directory of the pack's Python packages (one with an
``__init__.py``) appears in the Layers tree at its place, so a new package cannot land without its line on the
map. The engine's layer order written in the Rules is the one its imports follow."""

from __future__ import annotations

import re
from pathlib import Path

from test_package_structure import ENGINE, folder_graph, import_graph

import lorabind

PACKAGE_DIR = Path(lorabind.__file__).parent
DOC = PACKAGE_DIR / "docs" / "architecture.md"
SOURCE_FOLDERS = ("loaders", "nodes", "runtime", "usecases", "tiny_models")
TREE_LINE = re.compile(r"^( *)([a-z_0-9]+)/(?:\s|$)")


def documented_folders(text: str) -> set:
    """Folder paths of the Layers tree (the first code block after ``## Layers``), from the indentation: two
    spaces per level, as the tree is drawn."""
    block = text.split("## Layers", 1)[1].split("```", 2)[1]
    stack, found = [], set()
    for line in block.splitlines():
        match = TREE_LINE.match(line)
        if not match:
            continue
        level = len(match.group(1)) // 2
        stack[level:] = [match.group(2)]
        found.add("/".join(stack))
    return found


def package_folders(package_dir: Path = PACKAGE_DIR) -> set:
    return {str(init.parent.relative_to(package_dir)) for folder in SOURCE_FOLDERS
            for init in (package_dir / folder).rglob("__init__.py")}


def test_the_tree_is_read_with_its_nesting():
    text = "## Layers\n```\nloaders/   engine\n  lora/    x\n    kinds/ y\n  io/\nruntime/\n```\n"
    assert documented_folders(text) == {"loaders", "loaders/lora", "loaders/lora/kinds", "loaders/io", "runtime"}


def test_every_package_directory_is_on_the_map():
    missing = package_folders() - documented_folders(DOC.read_text(encoding="utf-8"))
    assert missing == set(), f"add these packages to the Layers tree of docs/architecture.md: {sorted(missing)}"


def engine_layers(text: str) -> list:
    """The engine's folders bottom to top, as the Rules' layer diagram lists them (``a -> b`` in one row)."""
    block = text.split("Inside the engine, bottom to top:", 1)[1].split("```", 2)[1]
    layers = []
    for line in block.strip().splitlines():
        names = line.strip().split("  ")[0].split(" (")[0].split(" -> ")
        layers += [ENGINE if name.strip() == "loaders" else f"{ENGINE}.{name.strip()}" for name in names]
    return layers


def test_the_engine_imports_follow_the_documented_layers():
    layers = engine_layers(DOC.read_text(encoding="utf-8"))
    assert layers[0] == ENGINE and f"{ENGINE}.families" in layers
    engine = {f for f in folder_graph(import_graph()) if f == ENGINE or f.startswith(ENGINE + ".")}
    assert engine == set(layers), "every engine subsystem is in the layer diagram, and only those"
    upward = [f"{a} -> {b}" for a, targets in folder_graph(import_graph()).items() if a in layers
              for b in targets if b in layers and layers.index(b) > layers.index(a)]
    assert upward == []
