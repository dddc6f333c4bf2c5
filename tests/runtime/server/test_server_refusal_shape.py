"""The refusals ``POST /prompt`` answers are node errors the pinned editor shows with their text (issue 45).

Frontend 1.58.1 words each node error from its own catalogue, keyed by the error's ``type``: an unknown type
("returned an unrecognized validation error") shows none of our text, and only some known types put the error's
``details`` into the Run toast. This reads that catalogue from the installed ``comfyui-frontend-package`` and
checks the types we send against it; the browser test (``test_server_browser_refusals.py``) sees the result."""

from __future__ import annotations

import json

import pytest

from lorabind.runtime.server.comfy_api import routes_frontend
from lorabind.runtime.server.comfy_api.prompt_service import CONTRACT_MISMATCH, REFUSAL_KEY, refusal_error

STATIC = routes_frontend.frontend_static_dir()
pytestmark = pytest.mark.skipif(STATIC is None, reason='the ui extra is not installed (pip install "lorabind[ui]")')


def _validation_catalogue() -> dict:
    """``errorCatalog.validationErrors`` of the frontend's English locale, as bundled in its main script."""
    marker = '"validationErrors":'
    for script in sorted((STATIC / "assets").glob("main-*.js")):
        text = script.read_text(encoding="utf-8")
        if marker in text:
            return json.JSONDecoder().raw_decode(text, text.index(marker) + len(marker))[0]
    raise AssertionError("no validationErrors catalogue in the frontend's main script")


def test_a_contract_refusal_is_a_type_the_editor_shows_with_its_text_in_the_toast_and_the_issues_panel():
    error = refusal_error(CONTRACT_MISMATCH, "Value breaks a file's sampling contract",
                          "a.safetensors is a 4-step distill LoRA: steps must be 4, got 20", "steps", 20)
    copy = _validation_catalogue().get(error["type"])
    assert copy is not None, f"{error['type']} is not a type frontend 1.58.1 knows"
    assert "{rawDetails}" in copy["toastMessageWithRawDetails"] and "{rawDetails}" in copy["detailsWithRawDetails"]
    assert error["extra_info"]["input_name"] == "steps" and error["extra_info"][REFUSAL_KEY] == CONTRACT_MISMATCH
