"""Fixtures only the node tests need: which real ComfyUI a real-ComfyUI test module runs in."""

import pytest

from real_comfyui import tested_versions


@pytest.fixture(scope="module", params=tested_versions())
def comfy_version(request) -> str:
    """Each ComfyUI version the harness carries (``$LORABIND_COMFY_VERSIONS`` narrows them), once per module: a module-scoped ComfyUI started with it serves
    every test of the module on that version (pytest groups the module's tests by this parameter)."""
    return request.param
