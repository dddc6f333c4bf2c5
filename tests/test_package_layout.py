"""The pack imports without ComfyUI, fast, and exposes what ComfyUI reads."""

import pathlib
import subprocess
import sys

import lorabind


def test_pack_exports_comfyui_entry_points():
    from lorabind import nodes

    assert lorabind.WEB_DIRECTORY == "./web"
    assert (pathlib.Path(lorabind.__file__).parent / "web").is_dir()
    assert lorabind.NODE_CLASS_MAPPINGS is nodes.NODE_CLASS_MAPPINGS
    # the core nodes every example workflow uses are registered, and each node has a display name
    assert {"LoraBindModelLoader", "LoraBindSampler", "WanMoELoRAPair"} <= set(lorabind.NODE_CLASS_MAPPINGS)
    assert set(lorabind.NODE_DISPLAY_NAME_MAPPINGS) == set(lorabind.NODE_CLASS_MAPPINGS)
    assert all(isinstance(cls, type) for cls in lorabind.NODE_CLASS_MAPPINGS.values())


def test_cli_help_does_not_import_torch():
    code = (
        "import sys; from lorabind.runtime.cli import build_parser; build_parser(); "
        "print(sorted(m for m in ('torch', 'diffusers', 'peft', 'transformers') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_requirements_txt_matches_pyproject_dependencies():
    import tomllib

    root = pathlib.Path(lorabind.__file__).parent
    declared = tomllib.loads((root / "pyproject.toml").read_text())["project"]["dependencies"]
    listed = [line.strip() for line in (root / "requirements.txt").read_text().splitlines()
              if line.strip() and not line.startswith("#")]
    assert sorted(listed) == sorted(d for d in declared if not d.startswith("torch"))


def test_pyproject_lists_every_package():
    """setuptools installs only the packages ``[tool.setuptools] packages`` names: a folder missing there is
    missing from the wheel, and ``pip install lorabind`` fails on its first import (as ``loaders.dispatch`` did)."""
    import tomllib

    root = pathlib.Path(lorabind.__file__).parent
    listed = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    folders = ("loaders", "nodes", "runtime", "usecases", "tiny_models")
    found = {".".join(("lorabind", *init.parent.relative_to(root).parts))
             for folder in folders for init in (root / folder).rglob("__init__.py")}
    assert sorted(listed) == sorted(found | {"lorabind"})
