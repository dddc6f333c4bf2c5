"""Headless-Chromium check of web/lorabind.js, served by the real server next to a stub of ComfyUI's app.

Skips (with the reason) when ``chromium`` is not installed; CI installs it with ``apt-get install chromium``.
"""

from __future__ import annotations

import html
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from lorabind.runtime.server.config import PACK_DIR
from server_client import start_server

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
BROWSER_DIR = Path(__file__).parent / "browser"
pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(CHROMIUM is None, reason="chromium is not on PATH (apt-get install chromium)")]


def _chromium(tmp_path, *args: str) -> subprocess.CompletedProcess:
    profile = tmp_path / "chromium-profile"
    command = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
               "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-dev-shm-usage",
               f"--user-data-dir={profile}", "--virtual-time-budget=10000", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def page_server(tmp_path_factory):
    srv = start_server(tmp_path_factory.mktemp("browser"), web_extensions={
        "lorabind": str(PACK_DIR / "web"), "lorabind_test": str(BROWSER_DIR)})
    yield srv
    srv.stop()


def test_extension_renders_contract_accounting_and_warning(page_server, tmp_path):
    url = f"{page_server.url}/extensions/lorabind_test/index.html"
    done = _chromium(tmp_path, "--dump-dom", url)
    match = re.search(r'<pre id="lorabind-result">(.*?)</pre>', done.stdout, re.S)
    assert match, f"no result block in the DOM dump; stderr: {done.stderr[-2000:]}"
    result = json.loads(html.unescape(match.group(1)))
    assert result["errors"] == []
    assert "/extensions/lorabind/lorabind.js" in result["extensions"]
    assert result["stylesheet"] is True
    assert result["before"] == "no file chosen"
    assert ("lightx2v_4step.safetensors (distill): 4 steps · shift 5 · cfg 1 · tasks t2v — from its file name"
            in result["fuse"])
    assert "lightx2v_4step.safetensors → transformer: 400 applied, 2 expected-unmatched, 0 unmatched" \
        in result["fuse"]
    assert result["badgeSerialized"] == ["strength"]  # the badge never enters widgets_values
    assert result["warningWhenMatching"] is False and result["warningWhenSteps8"] is True
    assert "lorabind-warning: ⚠ steps 8 ≠ 4 required by lightx2v_4step.safetensors" in result["sampler"]
    assert result["minimaxWarnings"] == ["⚠ shift 5 ≠ 3 required by minimax_h3_turbo_8step.safetensors"]
    assert "lorabind-line: ran: 8 steps · shift 5 · cfg 1" in result["sampler"]
    assert "lorabind-line: override: steps 8 instead of 4 (enforce_contract off)" in result["sampler"]

    shot = tmp_path / "page.png"
    _chromium(tmp_path, f"--screenshot={shot}", "--window-size=1200,500", url)
    from PIL import Image

    image = Image.open(shot).convert("RGB")
    assert image.size == (1200, 500)
    colors = image.getcolors(maxcolors=1 << 20)
    assert len(colors) > 50, "screenshot is blank"
    # the warning badge (#8a1f1f background from lorabind.css) is really painted
    warning_pixels = sum(count for count, rgb in colors if rgb == (0x8A, 0x1F, 0x1F))
    assert warning_pixels > 100
