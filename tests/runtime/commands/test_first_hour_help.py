"""What a new user reads first (issue 45 item 9): ``lorabind --help`` names ``models check``, ``merge``'s summary
says it takes single files too, and the CPU-torch advice comes before the command it applies to."""

from __future__ import annotations

from pathlib import Path

import lorabind
from lorabind.runtime.cli import build_parser

PACK = Path(lorabind.__file__).parent
INSTALL_COMMAND = "pip install torch==2.13.0 -e ."
CPU_INDEX = "--index-url https://download.pytorch.org/whl/cpu"


def test_the_top_level_help_names_models_check_and_merges_single_files():
    help_text = " ".join(build_parser().format_help().split())
    assert "models build the built-in tiny models (build-tiny); check a workflow's model files (check)" in help_text
    assert "merge fuse LoRA file(s) into a diffusers model folder or a single model file" in help_text


def test_the_cpu_torch_advice_comes_before_the_install_command_it_applies_to():
    for page in (PACK / "README.md", PACK / "docs" / "getting-started" / "installation.md"):
        text = page.read_text(encoding="utf-8")
        assert CPU_INDEX in text, page
        assert text.index(CPU_INDEX) < text.index(INSTALL_COMMAND), page


def test_the_fast_tier_duration_is_stated_as_measured_not_guessed():
    """Issue 45 item 9: "about a minute" was a guess; the pages give a measured figure with its conditions."""
    import re

    for page in (PACK / "CONTRIBUTING.md", PACK / "docs" / "getting-started" / "installation.md"):
        text = " ".join(page.read_text(encoding="utf-8").split())
        assert "about a minute" not in text, page
        assert re.search(r'-m "not slow" tests`.{0,20}[Mm]easured.{0,30}? \d+ tests \(\d+ skipped\) in \d+ min \d+ s '
                         r"on 2 cores", text), page
