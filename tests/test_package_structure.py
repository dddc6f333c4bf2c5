"""The package's structure rules, checked on the source: no import circles, no folder cycles, the engine imports
no host, only the composition roots import the tiny-model factory, and lazy imports only where the fast start
needs them. What a family may know, and where, is ``test_family_leaks.py``'s (it reads the imports through
``import_graph`` below).

All walk the files with ``ast``/Python rather than a shell, so they run anywhere the suite runs. The checks take
the package folder (or its import graph) as an argument, so they can be pointed at a tree made to breach them.
"""

from __future__ import annotations

import ast
from pathlib import Path

import lorabind

PACKAGE_DIR = Path(lorabind.__file__).parent
PACKAGE = "lorabind"
SOURCE_FOLDERS = ("loaders", "nodes", "runtime", "usecases", "tiny_models")


def source_files(package_dir: Path = PACKAGE_DIR) -> list:
    files = [package_dir / "__init__.py"]
    for folder in SOURCE_FOLDERS:
        files += sorted((package_dir / folder).rglob("*.py"))
    return files


def module_name(path: Path, package_dir: Path = PACKAGE_DIR) -> str:
    parts = list(path.relative_to(package_dir).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join([PACKAGE, *parts])


def _is_module(name: str, modules: set) -> bool:
    return name in modules


def import_graph(package_dir: Path = PACKAGE_DIR) -> dict:
    """{module: set of package modules it imports}: every relative import, at module level or inside a
    function (a lazy import hides a circle from Python, not from the design). ``from . import x`` names the
    submodule ``x`` when there is one; parent packages a submodule import runs are not edges (a package
    ``__init__`` that imports its own submodules would otherwise always be a circle)."""
    files = {module_name(path, package_dir): path for path in source_files(package_dir)}
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
    assert "lorabind.usecases.verbs" in graph["lorabind.nodes.sampler_nodes"]
    assert "lorabind.loaders.dispatch.contract_discovery" in graph["lorabind.usecases.sampling"]
    assert "lorabind.loaders.families.interface" in graph["lorabind.loaders.families.wan.family"]
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_the_package_has_no_import_circle():
    assert find_cycle(import_graph()) is None


ENGINE = f"{PACKAGE}.loaders"
SERVER = f"{PACKAGE}.runtime.server"


def folder_of(module: str) -> str:
    """The folder a module counts in: its directory (a package's own ``__init__`` belongs to it), except that an
    engine subsystem (a folder directly under ``loaders/``) counts with everything below it: the family packages
    are the families subsystem's parts (its registry imports them by name, which no import statement shows) and
    ``lora/kinds`` is lora's. Likewise the server's two API folders count with the server: its ``app`` assembles
    them over the plumbing they build on (their own order: ``tests/runtime/server/test_server_folders.py``)."""
    path = PACKAGE_DIR.joinpath(*module.split(".")[1:])
    folder = module if path.is_dir() else module.rpartition(".")[0]
    if folder.startswith(ENGINE + "."):
        return ".".join(folder.split(".")[:3])
    if folder.startswith(SERVER + "."):
        return SERVER
    return folder


def folder_graph(graph: dict) -> dict:
    """{folder: folders it imports}, from every import (lazy ones inside functions included). Only the package
    root (``lorabind/__init__``, the ComfyUI entry that imports the nodes) is left out; the engine root
    ``loaders`` (its shared leaves: errors, handles, contract_types, fp8, meta_modules) counts as a folder."""
    folders: dict = {}
    for module, targets in graph.items():
        source = folder_of(module)
        if source == PACKAGE:
            continue
        edges = folders.setdefault(source, set())
        edges.update(t for t in map(folder_of, targets) if t != source and t != PACKAGE)
    return folders


def test_the_folder_graph_is_read():
    folders = folder_graph(import_graph())
    assert f"{ENGINE}.families.wan" not in folders  # a family package is part of the families subsystem
    assert f"{ENGINE}.lora" in folders[f"{ENGINE}.families"]  # the key maps build lora's canonical patches
    assert ENGINE in folders[f"{ENGINE}.families"]  # the engine root's shared leaves count (errors, handles)
    assert f"{ENGINE}.families" in folders[f"{ENGINE}.dispatch"]  # the verbs that ask the family sit above it
    assert {f"{PACKAGE}.runtime", f"{PACKAGE}.runtime.executor"} <= set(folders)
    assert f"{PACKAGE}.runtime" in folders[f"{PACKAGE}.runtime.executor"]  # the execution context


def test_there_is_no_folder_cycle():
    """Folders import in one direction only, counting imports inside functions (a lazy import hides a circle
    from Python, not from the design). Before: ``loaders/lora`` <-> ``loaders/families`` (lora looked families
    up in the registry; now the caller passes the family in), ``nodes`` <-> ``runtime`` (lazy imports of the
    runtime's registry and context; now ``usecases.host``), ``runtime`` <-> ``runtime/executor`` (the
    workflow conversion imported the executor's type rule; now the leaf ``runtime/socket_types``), and after the
    engine split the subsystems among themselves (families <-> contracts/generation/models/placement, the engine
    root <-> contracts): the layering in ``docs/architecture.md`` now orders them."""
    assert find_cycle(folder_graph(import_graph())) is None


def test_nodes_and_runtime_are_no_folder_cycle():
    """The runtime imports the nodes to run them; the nodes reach its registry and execution context through
    ``usecases.host`` only (before: lazy imports of ``runtime.folder_paths``/``runtime.context``)."""
    folders = folder_graph(import_graph())
    runtime = [f for f in folders if f == f"{PACKAGE}.runtime" or f.startswith(f"{PACKAGE}.runtime.")]
    assert f"{PACKAGE}.nodes" in set().union(*(folders[f] for f in runtime))
    assert not set(runtime) & folders[f"{PACKAGE}.nodes"]
    assert not set(runtime) & folders[f"{PACKAGE}.usecases"]


def test_nodes_import_the_use_case_facade_not_the_engine():
    engine = f"{PACKAGE}.loaders"
    for module, targets in import_graph().items():
        if module.startswith(f"{PACKAGE}.nodes"):
            assert not [t for t in targets if t == engine or t.startswith(engine + ".")], module


def test_contract_types_import_nothing_of_ours():
    assert import_graph()["lorabind.loaders.contract_types"] == set()


# --------------------------------------------------------------------------------------------------------------
# layering at folder level (issue 23 part 5)

HOSTS = ("nodes", "runtime", "usecases")
FACTORY_PACKAGE = f"{PACKAGE}.tiny_models"
# Who may import the tiny-model factory: the hosts' composition roots, which install it as the built-in model
# provider (``usecases.host.install_builtin_models``), and the runtime's offline-build path (``lorabind models
# build``, ``run``/``serve`` building what a prompt names). The use cases and the nodes only see the port.
FACTORY_IMPORTERS = (f"{PACKAGE}", f"{PACKAGE}.runtime")
# Modules whose imports inside functions are allowed, each with a ``# lazy:`` comment saying why: what the CLI's
# fast start imports (``tests/test_package_layout.py``: ``--help`` without torch), the pack's ``__init__``
# (ComfyUI imports it by path) and the host port. Everywhere else imports sit at
# module level: the folder graph is acyclic, so a lazy import only hides an edge.
FAST_START = {PACKAGE, f"{PACKAGE}.loaders", f"{PACKAGE}.runtime", f"{PACKAGE}.runtime.cli",
              f"{PACKAGE}.runtime.context", f"{PACKAGE}.runtime.device_options", f"{PACKAGE}.runtime.folder_paths",
              f"{PACKAGE}.runtime.guide_flags",  # the guides' flag names, parsed by the command modules
              f"{PACKAGE}.usecases.host", f"{PACKAGE}.usecases.model_folders"}
FAST_START_PACKAGES = (f"{PACKAGE}.runtime.commands",)  # every CLI command module: the parser imports them all
# modules whose lazy imports keep an optional extra unimported (Ray, for a server that is not scaled out)
OPTIONAL_EXTRAS = {f"{PACKAGE}.runtime.server.composition_root"}


def _in(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def layering_breaches(graph: dict) -> list:
    """``importer -> imported: rule`` for each import that crosses a layer the wrong way."""
    found = []
    for module, targets in sorted(graph.items()):
        for target in sorted(targets):
            if _in(module, ENGINE) and any(_in(target, f"{PACKAGE}.{host}") for host in HOSTS):
                found.append(f"{module} -> {target}: the engine imports no host")
            if _in(target, FACTORY_PACKAGE) and not _in(module, FACTORY_PACKAGE) and not any(
                    module == allowed or (allowed != PACKAGE and _in(module, allowed))
                    for allowed in FACTORY_IMPORTERS):
                found.append(f"{module} -> {target}: only the hosts' composition roots import the factory")
    return found


def test_the_layering_check_sees_a_breach():
    assert layering_breaches({f"{ENGINE}.models.store": {f"{PACKAGE}.runtime.context"},
                              f"{PACKAGE}.usecases.models": {FACTORY_PACKAGE},
                              f"{PACKAGE}.runtime.commands.models": {FACTORY_PACKAGE},
                              PACKAGE: {FACTORY_PACKAGE}}) == [
        f"{ENGINE}.models.store -> {PACKAGE}.runtime.context: the engine imports no host",
        f"{PACKAGE}.usecases.models -> {FACTORY_PACKAGE}: only the hosts' composition roots import the factory"]


def test_the_engine_imports_no_host_and_only_hosts_import_the_factory():
    assert layering_breaches(import_graph()) == []


def lazy_imports(package_dir: Path = PACKAGE_DIR) -> dict:
    """{module: [(line, has a ``# lazy:`` comment)]} for each import of our own package inside a function. The
    comment is on the import's line or on the line above it (one comment may lead a group of imports)."""
    found = {}
    for path in source_files(package_dir):
        lines = path.read_text(encoding="utf-8").splitlines()
        for node in ast.walk(ast.parse("\n".join(lines))):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for inner in ast.walk(node):
                if isinstance(inner, ast.ImportFrom) and inner.level > 0:
                    above = inner.lineno - 2
                    while above >= 0 and lines[above].strip().startswith(("from ", "import ")):
                        above -= 1  # the first import of the group carries the comment
                    said = "# lazy:" in lines[inner.lineno - 1] or (above >= 0 and "# lazy:" in lines[above])
                    found.setdefault(module_name(path), []).append((inner.lineno, said))
    return found


def test_lazy_imports_only_on_the_fast_start_list_and_each_says_why():
    misplaced, unexplained = [], []
    for module, imports in lazy_imports().items():
        if module not in FAST_START | OPTIONAL_EXTRAS and not any(_in(module, p) for p in FAST_START_PACKAGES):
            misplaced += [f"{module}:{line}" for line, _ in imports]
        unexplained += [f"{module}:{line}" for line, said in imports if not said]
    assert misplaced == [], "hoist these to module level (or add the module to FAST_START, saying why)"
    assert unexplained == [], "say why with a '# lazy:' comment"
