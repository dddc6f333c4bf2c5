"""The pack imports without ComfyUI, fast, and exposes what ComfyUI reads."""

import subprocess
import sys

import lorabind


def test_pack_exports_comfyui_entry_points():
    assert lorabind.WEB_DIRECTORY == "./web"
    assert isinstance(lorabind.NODE_CLASS_MAPPINGS, dict)
    assert set(lorabind.NODE_DISPLAY_NAME_MAPPINGS) <= set(lorabind.NODE_CLASS_MAPPINGS)


def test_cli_help_does_not_import_torch():
    code = (
        "import sys; from lorabind.runtime.cli import build_parser; build_parser(); "
        "print(sorted(m for m in ('torch', 'diffusers', 'peft', 'transformers') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_requirements_txt_matches_pyproject_dependencies():
    import pathlib
    import tomllib

    root = pathlib.Path(lorabind.__file__).parent
    declared = tomllib.loads((root / "pyproject.toml").read_text())["project"]["dependencies"]
    listed = [line.strip() for line in (root / "requirements.txt").read_text().splitlines()
              if line.strip() and not line.startswith("#")]
    assert sorted(listed) == sorted(d for d in declared if not d.startswith("torch"))
