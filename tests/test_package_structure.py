"""The package's structure rules, checked on the source: no import circles, and no model-family dispatch
(``family == "…"``) outside ``loaders/families/``.

Both walk the files with ``ast``/Python rather than a shell, so they run anywhere the suite runs.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import lorabind

PACKAGE_DIR = Path(lorabind.__file__).parent
PACKAGE = "lorabind"
SOURCE_FOLDERS = ("loaders", "nodes", "runtime")
# the grep of HELPERS.md / issue #10: a family id compared or tested for membership
FAMILY_DISPATCH = re.compile(r"family *(==|!=|in *\()")


def source_files() -> list:
    files = [PACKAGE_DIR / "__init__.py"]
    for folder in SOURCE_FOLDERS:
        files += sorted((PACKAGE_DIR / folder).rglob("*.py"))
    return files


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE_DIR).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join([PACKAGE, *parts])


def _is_module(name: str, modules: set) -> bool:
    return name in modules


def import_graph() -> dict:
    """{module: set of package modules it imports}: every relative import, at module level or inside a
    function (a lazy import hides a circle from Python, not from the design). ``from . import x`` names the
    submodule ``x`` when there is one; parent packages a submodule import runs are not edges (a package
    ``__init__`` that imports its own submodules would otherwise always be a circle)."""
    files = {module_name(path): path for path in source_files()}
    modules = set(files)
    graph = {}
    for name, path in files.items():
        is_package = path.name == "__init__.py"
        package = name if is_package else name.rpartition(".")[0]
        edges = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.ImportFrom) or node.level == 0:
                continue
            base = package
            for _ in range(node.level - 1):
                base = base.rpartition(".")[0]
            target = f"{base}.{node.module}" if node.module else base
            for alias in node.names:
                submodule = f"{target}.{alias.name}"
                edges.add(submodule if submodule in modules else target)
        graph[name] = {edge for edge in edges if edge in modules and edge != name}
    return graph


def find_cycle(graph: dict):
    """One import circle as a list of modules, or None."""
    state, stack = {}, []

    def visit(node):
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        stack.pop()
        state[node] = "done"
        return None

    for start in sorted(graph):
        if start not in state:
            found = visit(start)
            if found:
                return found
    return None


def test_the_import_graph_is_read():
    graph = import_graph()
    assert "lorabind.loaders.contracts" in graph["lorabind.nodes.sampler_nodes"]
    assert "lorabind.loaders.families.interface" in graph["lorabind.loaders.families.wan.family"]
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_the_package_has_no_import_circle():
    assert find_cycle(import_graph()) is None


def test_contract_types_import_nothing_of_ours():
    assert import_graph()["lorabind.loaders.contract_types"] == set()


def dispatch_lines() -> list:
    found = []
    families = PACKAGE_DIR / "loaders" / "families"
    for path in source_files():
        if families in path.parents:
            continue
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if FAMILY_DISPATCH.search(line):
                found.append(f"{path.relative_to(PACKAGE_DIR)}:{number}: {line.strip()}")
    return found


def test_the_dispatch_pattern_matches_what_it_should():
    assert all(FAMILY_DISPATCH.search(line) for line in (
        'if model.family == "minimax_h3":', "if family != MOE:", 'if family in ("wan2.1", "wan2.2_moe"):'))
    assert not FAMILY_DISPATCH.search("family_for(model).has_audio")


def test_no_family_dispatch_outside_the_family_packages():
    assert dispatch_lines() == []
