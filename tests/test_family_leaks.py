"""Family knowledge stays in the family packages (``loaders/families/<family>/``).

Why a test: adding a family should mean one package and its line in the registry. Each piece of one family's
knowledge kept elsewhere is a place the next family has to find by hand (issue 41 counted about 18 for a family
with single files and GGUF), and only a check keeps that count at zero. Two axes are checked:

- models (issues 10 and 23): outside ``loaders/families/`` no family dispatch (``family == "…"``), no denoiser
  component name (``"transformer_2"``) and no table or row of family ids;
- single files (issue 41): no component-kind id (``"umt5"``, ``"wan_vae"``) and no import of a specific family
  package outside the families and the tiny-model factory, no example template named outside the families, and
  no family package naming another family.

The vocabularies (component names, family ids, kind ids, example names) are read from the registry, the
single-file catalog and the examples folder, not listed here, so a new family is checked as soon as it is
registered. Each check takes the package folder and has a companion test that builds a small tree breaching it.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path
from types import SimpleNamespace

from test_package_structure import ENGINE, FACTORY_PACKAGE, PACKAGE_DIR, _in, import_graph, source_files

FAMILIES = Path("loaders") / "families"
FAMILIES_PACKAGE = f"{ENGINE}.families"
# The tiny-model factory builds each family's folders and single files, so it may name their components and
# kinds (the families' tiny recipes name their builders there); its family-id tables and rows are still checked.
FACTORY = Path("tiny_models")
# the grep of HELPERS.md / issue #10: a family id compared or tested for membership
FAMILY_DISPATCH = re.compile(r"family *(==|!=|in *\()")


def outside_the_families(package_dir: Path) -> list:
    """``(path relative to the package, parsed module)`` of every source file outside ``loaders/families/``."""
    found = []
    for path in source_files(package_dir):
        relative = path.relative_to(package_dir)
        if FAMILIES not in relative.parents:
            found.append((relative, ast.parse(path.read_text(encoding="utf-8"))))
    return found


def _report(found: list) -> list:
    """``file:line: why`` lines, by file then line."""
    return [f"{relative}:{line}: {why}" for relative, line, why in sorted(found, key=lambda f: (str(f[0]), f[1]))]


def dispatch_lines() -> list:
    found = []
    for path in source_files():
        if FAMILIES in path.relative_to(PACKAGE_DIR).parents:
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
# component names, and tables and rows of family ids

def family_vocabulary() -> tuple:
    """(component names the families give their denoisers, every family / model family / requirements id)."""
    from lorabind.loaders import families

    components, ids = set(), set()
    for family in families.all_families():
        components.update(family.layout.lora_components)
        components.update(name for name, role in family.layout.index_roles.items() if "denoiser" in role or "expert" in role)
        ids.update({family.id, *family.model_families, *family.layout.requirements})
    return frozenset(components), frozenset(ids)


def _string_constants(node) -> list:
    return [n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, str)]


def _row_fields(node) -> list:
    """The fields of a row: the items of a tuple, list or set literal, or the arguments (keywords included) of a
    call to a class, a capitalised name (``ComponentKind("umt5", "text_encoder", "wan", ...)``). A function
    call's arguments are not a row (the factory's ``require("minimax_h3", ...)`` asks for its own family's
    libraries)."""
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return node.elts
    if isinstance(node, ast.Call):
        callee = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
        if callee[:1].isupper():
            return [*node.args, *(keyword.value for keyword in node.keywords)]
    return []


def family_knowledge_leaks(package_dir: Path = PACKAGE_DIR) -> list:
    """``file:line: why`` for each component-name literal outside the family packages and the factory, each dict
    literal outside the family packages with a family id among its keys or values (at any depth), and each row
    outside them with a family id among its own fields (a positional family field: the single-file catalog's
    ``ComponentKind(..., "wan", ...)``). A table or row names the families one by one, so the next family has
    to add its line there."""
    components, ids = family_vocabulary()
    found = []
    for relative, tree in outside_the_families(package_dir):
        in_factory = FACTORY in relative.parents
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and node.value in components and not in_factory:
                found.append((relative, node.lineno, f"component name {node.value!r}"))
            if isinstance(node, ast.Dict):
                listed = [v for part in (*node.keys, *node.values) if part is not None for v in _string_constants(part)]
                if set(listed) & ids:
                    found.append((relative, node.lineno, f"a table of family ids {sorted(set(listed) & ids)}"))
            named = sorted({f.value for f in _row_fields(node) if isinstance(f, ast.Constant) and f.value in ids})
            if named:
                found.append((relative, node.lineno, f"a row of family ids {named}"))
    return _report(found)


def write_tree(root: Path, files: dict) -> Path:
    """A package tree under ``root``: ``{relative path: source}``, plus the package's ``__init__``."""
    (root / "__init__.py").write_text("")
    for relative, text in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def test_the_leak_check_sees_literals_tables_and_rows(tmp_path):
    table_and_row = 'LOW = "transformer_2"\nREQ = {"wan2.1": 1}\nROW = Kind("x", family="qwen_image")\n'
    write_tree(tmp_path, {
        "nodes/leaky.py": table_and_row + 'PAIR = ["minimax_h3", 2]\nok = name.startswith("trans") and "vae"\n',
        "tiny_models/builder.py": 'LOW = "transformer_2"\nrequire("minimax_h3")\nROW = ("wan", 1)\n',
        "loaders/families/fine.py": table_and_row})
    assert family_knowledge_leaks(tmp_path) == [
        "nodes/leaky.py:1: component name 'transformer_2'", "nodes/leaky.py:2: a table of family ids ['wan2.1']",
        "nodes/leaky.py:3: a row of family ids ['qwen_image']", "nodes/leaky.py:4: a row of family ids ['minimax_h3']",
        "tiny_models/builder.py:3: a row of family ids ['wan']"]


def test_no_component_name_or_family_table_or_row_outside_the_family_packages():
    assert family_knowledge_leaks() == []


# --------------------------------------------------------------------------------------------------------------
# component-kind ids (the single-file axis)

def component_kind_ids() -> frozenset:
    """The single-file component kinds (``"wan_vae"``, ``"umt5"``, ``"qwen25_vl"``...): every kind the
    single-file catalog detects, whichever family declares it; less those that are also the name of a ComfyUI
    model folder (``clip_vision``: the nodes and the model check name ``models/clip_vision``, the host's
    folder, which no family owns)."""
    from lorabind.loaders.models.single_file import catalog
    from lorabind.runtime import folder_paths

    return frozenset(catalog.kinds()) - frozenset(folder_paths._DEFAULT_KINDS)


def component_kind_leaks(package_dir: Path = PACKAGE_DIR) -> list:
    """``file:line: component kind 'x'`` for each kind-id literal outside the families and the factory. A generic
    module that names a kind (``_TOKENIZER = {"umt5": ...}``, ``kind == "qwen25_vl"``) holds a text encoder's or
    a layout's knowledge that belongs to the family declaring the kind."""
    kinds = component_kind_ids()
    return _report([(relative, node.lineno, f"component kind {node.value!r}")
                    for relative, tree in outside_the_families(package_dir) if FACTORY not in relative.parents
                    for node in ast.walk(tree) if isinstance(node, ast.Constant) and node.value in kinds])


def test_the_kind_check_sees_kind_ids(tmp_path):
    assert "umt5" in component_kind_ids() and "clip_vision" not in component_kind_ids()
    write_tree(tmp_path, {
        "loaders/models/tokens.py": 'TOKENIZERS = {"umt5": build}\nif kind == "qwen25_vl":\n    FOLDER = "clip_vision"\n',
        "tiny_models/files.py": 'KIND = "umt5"\n', "loaders/families/wan/files.py": 'KIND = "umt5"\n'})
    assert component_kind_leaks(tmp_path) == [
        "loaders/models/tokens.py:1: component kind 'umt5'", "loaders/models/tokens.py:2: component kind 'qwen25_vl'"]


def test_no_component_kind_id_outside_the_families_and_the_factory():
    assert component_kind_leaks() == []


# --------------------------------------------------------------------------------------------------------------
# imports of a specific family package

def family_package_imports(package_dir: Path = PACKAGE_DIR) -> list:
    """``importer -> imported`` for each import of a family package (a folder with an ``__init__`` under
    ``loaders/families/``) from outside the families and the factory, lazy imports included. Generic code
    reaches a family through the registry; an import by name (``layouts`` importing
    ``families.qwen_image.single_files``) is an edge the next family must copy, and no test would notice a
    family left out."""
    families_dir = package_dir / FAMILIES
    packages = [f"{FAMILIES_PACKAGE}.{folder.name}" for folder in sorted(families_dir.iterdir())
                if (folder / "__init__.py").is_file()]
    found = []
    for module, targets in sorted(import_graph(package_dir).items()):
        if not _in(module, FAMILIES_PACKAGE) and not _in(module, FACTORY_PACKAGE):
            found += [f"{module} -> {target}" for target in sorted(targets) if any(_in(target, p) for p in packages)]
    return found


def test_the_import_check_sees_a_family_package_imported(tmp_path):
    write_tree(tmp_path, {
        "loaders/__init__.py": "", "loaders/models/__init__.py": "",
        "loaders/families/__init__.py": "from . import alpha\n", "loaders/families/alpha/__init__.py": "",
        "loaders/families/alpha/layout.py": "X = 1\n", "loaders/families/beta/__init__.py": "from ..alpha import X\n",
        "loaders/models/layouts.py": "from ..families.alpha.layout import X\nfrom ..families import all_families\n",
        "runtime/late.py": "def load():\n    from ..loaders.families import alpha\n",
        "tiny_models/__init__.py": "from ..loaders.families.alpha import layout\n"})
    assert family_package_imports(tmp_path) == [
        "lorabind.loaders.models.layouts -> lorabind.loaders.families.alpha.layout",
        "lorabind.runtime.late -> lorabind.loaders.families.alpha"]


def test_no_family_package_imported_outside_the_families_and_the_factory():
    assert family_package_imports() == []


# --------------------------------------------------------------------------------------------------------------
# a family package naming another family

def family_names(family) -> re.Pattern:
    """What names a family in a string: its ids and labels (``"wan2.1"``, ``"Qwen-Image"``), and the word its id
    starts with (``"qwen"``, ``"minimax"``) when no letter or digit follows it (``"Qwen3"``, MiniMax-H3's text
    encoder, is not Qwen-Image)."""
    words = sorted({family.id, *family.model_families, *family.layout.requirements, *family.layout.labels.values()},
                   key=len, reverse=True)
    stem = re.match(r"[a-z]+", family.id)[0]
    return re.compile("|".join([*map(re.escape, words), rf"(?<![a-z]){stem}(?![a-z0-9])"]), re.IGNORECASE)


def _docstrings(tree) -> set:
    return {node.body[0].value for node in ast.walk(tree)
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body
            and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}


def cross_family_mentions(families, package_dir: Path = PACKAGE_DIR) -> list:
    """``file:line: names family 'x' ('text')`` for each string in a family's package (``loaders/families/<id>/``)
    that names another family. Such a string (Wan's contracts telling Qwen-Image's and MiniMax-H3's LoRA names
    by ``"qwen|minimax"``) makes a family's behaviour depend on the list of the others: the next family would
    have to edit it too. Docstrings are left out: explaining how another family differs changes nothing."""
    names = {family.id: family_names(family) for family in families}
    found = []
    for own in names:
        for path in sorted((package_dir / FAMILIES / own).rglob("*.py")):
            tree = ast.parse(path.read_text(encoding="utf-8"))
            docstrings = _docstrings(tree)
            texts = [n for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)]
            for node in (text for text in texts if text not in docstrings):
                found += [(path.relative_to(package_dir), node.lineno, f"names family {other!r} ({match[0]!r})")
                          for other, pattern in names.items() if other != own
                          for match in [pattern.search(node.value)] if match]
    return _report(found)


def test_the_cross_family_check_sees_another_family_named(tmp_path):
    alpha = SimpleNamespace(id="alpha", model_families=("alpha1",), layout=SimpleNamespace(
        requirements={"alpha1": {}}, labels={"alpha1": "Alpha One"}))
    beta = SimpleNamespace(id="beta_x", model_families=("beta_x",), layout=SimpleNamespace(
        requirements={}, labels={"beta_x": "Beta-X"}))
    write_tree(tmp_path, {
        "loaders/families/alpha/contracts.py": '"""Unlike Beta-X\'s."""\nOTHER = r"beta|gamma"\n'
                                               'OWN = "an Alpha One model"\nENCODER = "Beta3"\n',
        "loaders/families/beta_x/notes.py": 'NOTE = f"not for Alpha One: {name}"\n'})
    assert cross_family_mentions((alpha, beta), tmp_path) == [
        "loaders/families/alpha/contracts.py:2: names family 'beta_x' ('beta')",
        "loaders/families/beta_x/notes.py:1: names family 'alpha' ('Alpha One')"]


def test_no_family_package_names_another_family():
    from lorabind.loaders import families

    assert cross_family_mentions(families.all_families()) == []


# --------------------------------------------------------------------------------------------------------------
# the example templates' order

def example_names(package_dir: Path = PACKAGE_DIR) -> frozenset:
    """The served example templates: ``workflows/NAME.json``."""
    return frozenset(path.name.removesuffix(".json") for path in (package_dir / "workflows").glob("*.json"))


def example_name_leaks(package_dir: Path = PACKAGE_DIR) -> list:
    """``file:line: example template 'x'`` for each example name outside the families. An example runs one
    family's model, so a generic module listing examples (the server's hand-made template order) is a per-family
    list the next family must join; the family says where its examples go."""
    names = example_names(package_dir)
    return _report([(relative, node.lineno, f"example template {node.value!r}")
                    for relative, tree in outside_the_families(package_dir)
                    for node in ast.walk(tree) if isinstance(node, ast.Constant) and node.value in names])


def test_the_example_check_sees_an_example_named(tmp_path):
    write_tree(tmp_path, {
        "workflows/api/alpha_demo.api.json": "{}", "workflows/alpha_demo.json": "{}",
        "runtime/server/order.py": 'ORDER = ("alpha_demo", "other")\n',
        "loaders/families/alpha/examples.py": 'ORDER = ("alpha_demo",)\n'})
    assert example_name_leaks(tmp_path) == ["runtime/server/order.py:1: example template 'alpha_demo'"]


def test_no_example_template_named_outside_the_families():
    assert example_names(), "no served example found: the check would pass whatever the code names"
    assert example_name_leaks() == []
