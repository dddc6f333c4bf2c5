"""Collecting the suite imports no optional extra (issue 54: 236 s just to collect on a loaded 2-core machine).

Every run, whatever it selects, collects every module; a module that imports Ray Serve or the OpenAI client at
its top made every run pay for them (0.7 s and 0.5 s quiet, many times that under load). Such modules ask
``optional_extras.requires`` / ``deferred`` instead. What collection still costs (measured in issue 54's closing
note): torch, diffusers and transformers, imported once because the test modules import the engine, and pytest's
assertion rewriting, which is cached in ``__pycache__`` unless ``PYTHONDONTWRITEBYTECODE`` is set.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # collects the whole suite in a child process

TESTS = Path(__file__).parent
EXTRAS = ("ray", "openai")

_PROBE = '''
import sys
def pytest_collection_finish(session):
    print("IMPORTED", " ".join(m for m in {EXTRAS!r} if m in sys.modules), file=sys.__stdout__)
'''


def test_collecting_every_test_module_imports_neither_ray_nor_openai(tmp_path):
    (tmp_path / "collection_probe.py").write_text(_PROBE.format(EXTRAS=EXTRAS))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-s", "-p", "collection_probe",
                           str(TESTS)], cwd=TESTS.parent, env=env, capture_output=True, text=True, timeout=900)
    [line] = [line for line in done.stdout.splitlines() if line.startswith("IMPORTED")]
    assert done.returncode == 0 and line.split()[1:] == [], (line, done.stdout[-2000:])
