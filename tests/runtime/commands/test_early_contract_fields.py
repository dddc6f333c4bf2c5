"""Every field a file's contract fixes is checked from the prompt alone, before any model loads (issue 60, item 3):
not only ``steps`` but ``cfg`` (and ``cfg_low_noise``), ``shift`` and ``scheduler``, in the sampler's own words, so
``serve`` (one process or ``--parallel``'s rank 0) answers a breach with a 400 instead of queueing it. What the
sampler would accept is never refused early: a value through a link, ``enforce_contract`` off, a ``sigmas``
input, the matching values.

The template is the tiny Qwen-Image Lightning one: its 4-step distill LoRA declares steps 4, shift 3, cfg 1, and
is sampled with euler by its publisher."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import lorabind
from lorabind.runtime import folder_paths
from lorabind.runtime.commands.run import contract_refusals, load_node_classes

TEMPLATE = Path(lorabind.__file__).parent / "workflows" / "api" / "qwen_image_lightning.api.json"
LORA = "Qwen-Image-Lightning-4steps-V1.0.safetensors is a 4-step distill LoRA"


@pytest.fixture
def refusals_of(tiny_models_root):
    node_classes, _ = load_node_classes()
    folder_paths.configure(models_root=str(tiny_models_root))

    def refusals(**changes) -> list:
        prompt = json.loads(TEMPLATE.read_text())
        prompt["6"]["inputs"].update(changes)
        return contract_refusals(prompt, node_classes)

    yield refusals
    folder_paths.configure()


@pytest.mark.parametrize("changes, input_name, words", [
    ({"cfg": 5.0}, "cfg", f"{LORA}: cfg must be 1, got 5 (its file name declares this contract"),
    ({"cfg_low_noise": 3.5}, "cfg_low_noise", f"{LORA}: cfg_low_noise must be 1, got 3.5"),
    ({"shift": 5.0}, "shift", f"{LORA}: shift must be 3, got 5"),
    ({"shift": 0.0}, "shift", f"{LORA}: shift must be 3, got 0"),  # the sampler refuses 0 here too
    ({"scheduler": "unipc"}, "scheduler", "is sampled with scheduler euler by its publisher: scheduler must be "
                                          "euler or default, got unipc"),
    ({"steps": 20, "cfg": 5.0}, "steps", f"{LORA}: steps must be 4, got 20"),  # one per sampler, steps first
])
def test_a_breach_of_any_declared_field_is_refused_naming_the_input(refusals_of, changes, input_name, words):
    refused = refusals_of(**changes)
    assert len(refused) == 1
    node_id, name, message = refused[0]
    assert (node_id, name) == ("6", input_name) and words in message and "enforce_contract off" in message


@pytest.mark.parametrize("changes", [
    {},  # the template as shipped
    {"cfg": 1.0000001, "scheduler": "default"},
    {"cfg": 5.0, "enforce_contract": False},
    {"cfg": ["9", 0]},  # through a link: its value is not known before running
    {"shift": 5.0, "sigmas": ["9", 0]},  # the sampler takes the schedule from its sigmas input then
    {"steps": 20, "sigmas": ["9", 0]},
    {"cfg_low_noise": 0.0},
    {"scheduler": "euler"},
])
def test_what_the_sampler_accepts_is_not_refused_early(refusals_of, changes):
    assert refusals_of(**changes) == []
