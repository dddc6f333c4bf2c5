"""Family knowledge stays in the family packages (``loaders/families/<family>/``): outside them no family dispatch
(``family == "…"``), no denoiser component name (``"transformer_2"``, a ``startswith("transformer")``
convention) and no table keyed by (or listing) family ids.

Why a test: adding a family should mean one package and its line in the registry, and only a check keeps the
places a family must be named elsewhere at zero. The vocabularies are read from the registry, not listed here.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from test_package_structure import PACKAGE_DIR, source_files

# the grep of HELPERS.md / issue #10: a family id compared or tested for membership
FAMILY_DISPATCH = re.compile(r"family *(==|!=|in *\()")


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


# --------------------------------------------------------------------------------------------------------------
# family knowledge stays in the family packages

# The tiny-model factory builds each family's folders (it names their components by necessity); it leaves the
# engine in the package split that follows, and its family-id tables are still checked.
FACTORY = Path("tiny_models")


def family_vocabulary() -> tuple:
    """(component names the families give their denoisers, every family / model family / requirements id)."""
    from lorabind.loaders import families

    components, ids = set(), set()
    for family in families.all_families():
        components.update(family.lora_components)
        components.update(name for name, role in family.index_roles.items() if "denoiser" in role or "expert" in role)
        ids.update({family.id, *family.model_families, *family.requirements})
    return frozenset(components), frozenset(ids)


def _string_constants(node) -> list:
    return [n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, str)]


def family_knowledge_leaks(package_dir: Path = PACKAGE_DIR) -> list:
    """``file:line: why`` for each component-name literal outside the family packages and the factory, and each
    dict literal outside the family packages with a family id among its keys or values."""
    components, ids = family_vocabulary()
    families_dir = package_dir / "loaders" / "families"
    found = []
    for path in source_files(package_dir):
        if families_dir in path.parents:
            continue
        relative = path.relative_to(package_dir)
        in_factory = FACTORY in relative.parents
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Constant) and node.value in components and not in_factory:
                found.append(f"{relative}:{node.lineno}: component name {node.value!r}")
            if isinstance(node, ast.Dict):
                listed = [v for part in (*node.keys, *node.values) if part is not None for v in _string_constants(part)]
                named = sorted(set(listed) & ids)
                if named:
                    found.append(f"{relative}:{node.lineno}: a table of family ids {named}")
    return found


def test_the_leak_check_sees_literals_and_tables(tmp_path):
    (tmp_path / "loaders" / "families").mkdir(parents=True)
    for folder in ("nodes", "runtime", "usecases"):
        (tmp_path / folder).mkdir()
    (tmp_path / "__init__.py").write_text("")
    (tmp_path / "nodes" / "leaky.py").write_text(
        'LOW = "transformer_2"\nREQ = {"wan2.1": 1}\nok = name.startswith("trans") and "vae"\n')
    (tmp_path / "loaders" / "families" / "fine.py").write_text('LOW = "transformer_2"\nREQ = {"wan2.1": 1}\n')
    assert family_knowledge_leaks(tmp_path) == [
        "nodes/leaky.py:1: component name 'transformer_2'", "nodes/leaky.py:2: a table of family ids ['wan2.1']"]


def test_no_component_name_or_family_table_outside_the_family_packages():
    assert family_knowledge_leaks() == []
