"""What ComfyUI 0.3.64 does with an input a node does not declare (issue 46 item 9), observed in real ComfyUI
with its own nodes: ``/prompt`` accepts both forms; an undeclared constant is dropped and the prompt runs; an
undeclared link is passed to the node's function, which fails at run time with a ``TypeError``. The runtime keeps
the first and refuses the second at validation instead (``tests/runtime/executor/test_validation_undeclared.py``):
the same prompts, with the same node, checked here against the runtime's validator too."""

from __future__ import annotations

import pytest

from lorabind.runtime.core_nodes import runtime_node_classes
from lorabind.runtime.executor import PromptExecutor
from real_comfyui import RealComfyUI, require_harness

pytestmark = pytest.mark.slow


def _prompt(extra) -> dict:
    return {"1": {"class_type": "EmptyImage", "inputs": {"width": 8, "height": 8, "batch_size": 1, "color": 0}},
            "2": {"class_type": "PreviewImage", "inputs": {"images": ["1", 0], "image_4": extra}}}


class _EmptyImage:
    """The runtime has no EmptyImage; a stand-in with its declaration (an IMAGE from four numbers)."""

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {name: ("INT", {"default": 0}) for name in ("width", "height", "batch_size", "color")}}

    RETURN_TYPES = ("IMAGE",)
    FUNCTION = "generate"

    def generate(self, **_):
        raise AssertionError("validation only")


def test_undeclared_inputs_in_real_comfyui_and_in_the_runtime(tmp_path):
    require_harness()
    (tmp_path / "models").mkdir()
    with RealComfyUI(tmp_path, tmp_path / "models") as comfy:
        constant = comfy.run(_prompt(5))
        linked = comfy.run(_prompt(["1", 0]))
    assert constant.status == 200 and constant.error is None
    assert linked.status == 200 and linked.error is not None
    assert linked.error["exception_type"] == "TypeError" and "image_4" in linked.error["exception_message"]

    runtime = PromptExecutor({**runtime_node_classes()[0], "EmptyImage": _EmptyImage})
    assert runtime.validate(_prompt(5)).ok
    refused = runtime.validate(_prompt(["1", 0]))
    error, = refused.node_errors["2"]["errors"]
    assert error["type"] == "undeclared_input" and error["extra_info"]["input_name"] == "image_4"
