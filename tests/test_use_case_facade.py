"""The use-case facade's shape (issue 41 part 3): nodes reach the use cases through ``usecases.verbs`` (functions
only) and ``usecases.vocabulary`` (the nouns), plus the two torch-free host ports; the package's ``__init__``
imports nothing, so the CLI's fast start, which imports those ports, does not run a facade."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

from test_package_structure import PACKAGE, import_graph

import lorabind
from lorabind.usecases import verbs, vocabulary

USECASES = f"{PACKAGE}.usecases"
# what a node may import of the use-case layer: the facade, its vocabulary and the host ports nodes ask for their
# registry and execution context (``usecases.host``) and the one LoRA list (``usecases.model_folders``)
NODE_ENTRIES = {f"{USECASES}.verbs", f"{USECASES}.vocabulary", f"{USECASES}.host", f"{USECASES}.model_folders"}


def use_case_imports_outside_the_facade(graph: dict) -> list:
    """``node module -> use-case module`` for each import of the use-case layer that skips the facade."""
    return [f"{module} -> {target}" for module, targets in sorted(graph.items())
            if module.startswith(f"{PACKAGE}.nodes") for target in sorted(targets)
            if (target == USECASES or target.startswith(USECASES + ".")) and target not in NODE_ENTRIES]


def test_the_facade_check_sees_a_node_that_skips_it():
    graph = {f"{PACKAGE}.nodes.model_nodes": {f"{USECASES}.models", f"{USECASES}.verbs"},
             f"{PACKAGE}.nodes.sampler_nodes": {USECASES},
             f"{PACKAGE}.runtime.cli": {f"{USECASES}.models"}}
    assert use_case_imports_outside_the_facade(graph) == [f"{PACKAGE}.nodes.model_nodes -> {USECASES}.models",
                                                          f"{PACKAGE}.nodes.sampler_nodes -> {USECASES}"]


def test_nodes_reach_the_use_cases_through_the_facade():
    assert use_case_imports_outside_the_facade(import_graph()) == []


def test_the_use_case_package_init_imports_nothing():
    tree = ast.parse((Path(lorabind.__file__).parent / "usecases" / "__init__.py").read_text(encoding="utf-8"))
    assert [type(node).__name__ for node in tree.body] == ["Expr"]  # its docstring only


def test_the_facade_offers_functions_only():
    assert verbs.__all__ and all(inspect.isfunction(getattr(verbs, name)) for name in verbs.__all__)


def test_the_facade_and_the_vocabulary_export_exactly_what_they_import_or_define():
    for module in (verbs, vocabulary):
        tree = ast.parse(Path(module.__file__).read_text(encoding="utf-8"))
        named = {alias.asname or alias.name for node in tree.body if isinstance(node, ast.ImportFrom)
                 for alias in node.names}
        named |= {target.id for node in tree.body if isinstance(node, ast.Assign) for target in node.targets
                  if isinstance(target, ast.Name) and target.id != "__all__"}
        assert sorted(module.__all__) == sorted(named), module.__name__
        assert len(module.__all__) == len(set(module.__all__)), module.__name__
