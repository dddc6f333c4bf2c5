"""The main workflow, executed headless through the real node classes and the executor, end to end."""

import copy
import json
from pathlib import Path

import pytest
import torch
from PIL import Image

import lorabind
from lorabind.nodes import NODE_CLASS_MAPPINGS
from lorabind.runtime.executor import PromptExecutor
from lorabind.runtime.workflow_format import to_api_prompt

pytestmark = pytest.mark.slow  # runs whole workflows / servers end to end

WORKFLOWS = Path(lorabind.__file__).parent / "workflows" / "api"
TEMPLATES = Path(lorabind.__file__).parent / "workflows"
API_PROMPT = json.loads((WORKFLOWS / "wan22_tiny_t2v.api.json").read_text())
UI_WORKFLOW = json.loads((TEMPLATES / "wan22_tiny_t2v.json").read_text())
EXIF_PROMPT_TAG, EXIF_FIRST_EXTRA_TAG = 0x0110, 0x010F


@pytest.fixture
def output_dir(registry):
    return Path(registry.output_directory)


def _run(prompt):
    result = PromptExecutor(NODE_CLASS_MAPPINGS).execute(
        prompt, "test-prompt", extra_data={"extra_pnginfo": {"workflow": UI_WORKFLOW}}
    )
    assert result.success, result.error
    return result


def _save_node_id(prompt):
    return next(i for i, n in prompt.items() if n["class_type"] == "LoraBindSaveImage")


def _saved_file(result, prompt, output_dir):
    ui = result.outputs[_save_node_id(prompt)]
    (entry,) = ui["images"]
    assert entry["type"] == "output"
    return output_dir / entry["subfolder"] / entry["filename"], ui["animated"]


def test_ui_workflow_converts_to_the_api_workflow():
    converted, kind = to_api_prompt(UI_WORKFLOW, NODE_CLASS_MAPPINGS)
    assert kind == "ui"
    assert _inputs(converted) == _inputs(API_PROMPT)


def test_main_workflow_writes_an_animated_webp_with_prompt_and_workflow_in_exif(output_dir):
    result = _run(copy.deepcopy(API_PROMPT))
    path, animated = _saved_file(result, API_PROMPT, output_dir)
    assert animated == [True] and path.suffix == ".webp" and path.is_file()
    latent_inputs = API_PROMPT["4"]["inputs"]
    with Image.open(path) as image:
        assert image.n_frames == latent_inputs["frames"]
        assert image.size == (latent_inputs["width"], latent_inputs["height"])
        exif = image.getexif()
    key, _, value = exif[EXIF_PROMPT_TAG].partition(":")
    assert key == "prompt" and _inputs(json.loads(value)) == _inputs(API_PROMPT)
    key, _, value = exif[EXIF_FIRST_EXTRA_TAG].partition(":")
    assert key == "workflow" and json.loads(value) == UI_WORKFLOW
    sampler_ui = result.outputs["5"]
    (schedule,) = sampler_ui["lorabind_schedule"]
    assert schedule["steps"] == API_PROMPT["5"]["inputs"]["steps"] and len(schedule["sigmas"]) == schedule["steps"] + 1
    assert schedule["experts"] == ["transformer" if s >= schedule["boundary"] else "transformer_2"
                                   for s in schedule["sigmas"][:-1]]
    assert any("experts" in line for line in sampler_ui["text"])


def _inputs(prompt):
    """{node id: (class, inputs)}: what an embedded prompt must preserve (``_meta`` titles may be dropped)."""
    return {i: (n["class_type"], n["inputs"]) for i, n in prompt.items()}


def test_one_frame_is_saved_as_png_with_prompt_and_workflow_text_chunks(output_dir):
    prompt = copy.deepcopy(API_PROMPT)
    prompt["4"]["inputs"]["frames"] = 1
    result = _run(prompt)
    path, animated = _saved_file(result, prompt, output_dir)
    assert animated == [False] and path.suffix == ".png"
    with Image.open(path) as image:
        assert image.size == (prompt["4"]["inputs"]["width"], prompt["4"]["inputs"]["height"])
        chunks = dict(image.text)
    assert _inputs(json.loads(chunks["prompt"])) == _inputs(prompt)
    assert json.loads(chunks["workflow"]) == UI_WORKFLOW
    assert not list(path.parent.glob("*.part")), "temp files of the atomic write must not remain"


def test_decode_output_is_a_comfyui_image(tiny_models_root, output_dir):
    loader = NODE_CLASS_MAPPINGS["LoraBindModelLoader"]()
    (model,) = loader.load("tiny-wan22-t2v", "auto")
    encode = NODE_CLASS_MAPPINGS["LoraBindTextEncode"]()
    (pos,), (neg,) = encode.encode(model, "a cat"), encode.encode(model, "blurry")
    (latent,) = NODE_CLASS_MAPPINGS["LoraBindEmptyLatent"]().generate(model, 32, 32, 5, 1)
    sampled = NODE_CLASS_MAPPINGS["LoraBindSampler"]().sample(model, pos, neg, latent, 1, 2, 1.0, 5.0, 0.0, True)
    (images,) = NODE_CLASS_MAPPINGS["LoraBindVAEDecode"]().decode(model, sampled["result"][0])
    assert images.dtype == torch.float32 and images.shape == (5, 32, 32, 3)
    assert float(images.min()) >= 0.0 and float(images.max()) <= 1.0 and float(images.std()) > 0.0
