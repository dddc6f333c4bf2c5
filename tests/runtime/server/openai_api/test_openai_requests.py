"""The OpenAI-style endpoints' request -> prompt mapping and their refusals, without a server or a model run.

Templates are the shipped workflows with their ``_meta.openai`` declarations; node classes are the real ones.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from types import SimpleNamespace

import pytest

import lorabind
from lorabind.runtime.core_nodes import runtime_node_classes
from lorabind.runtime.server.openai.errors import OpenAIRequestError
from lorabind.runtime.server.openai.jobs import validation_error
from lorabind.runtime.server.openai.loras import confined_lora_name
from lorabind.runtime.server.openai.requests import parse_chat, parse_images, parse_video
from lorabind.runtime.server.openai.results import failure
from lorabind.runtime.server.openai.templates import fill_in, load_template

WORKFLOWS = Path(lorabind.__file__).parent / "workflows" / "api"
NODE_CLASSES = runtime_node_classes()[0]
# the vllm-omni LoRA guide's distill request body (prompt shortened)
GUIDE_BODY = {"messages": [{"role": "user", "content": "A Chinese female college student"}],
              "extra_body": {"height": 1024, "width": 1024, "num_inference_steps": 4, "true_cfg_scale": 1.0,
                             "seed": 42}}


@pytest.fixture
def loras(registry_at, tmp_path):
    """A models root whose LoRA folder holds one file and one PEFT folder, plus a file outside it."""
    root = tmp_path / "models"
    (root / "loras" / "styles" / "ink").mkdir(parents=True)
    (root / "loras" / "styles" / "ink" / "adapter_config.json").write_text("{}")
    (root / "loras" / "detail.safetensors").write_bytes(b"x")
    (tmp_path / "elsewhere.safetensors").write_bytes(b"x")
    registry_at(root)
    return root


def _template(name: str, model: str = "m"):
    return load_template(model, str(WORKFLOWS / f"{name}.api.json"), NODE_CLASSES)


def _refusal(call, *args) -> OpenAIRequestError:
    with pytest.raises(OpenAIRequestError) as caught:
        call(*args)
    assert caught.value.status == 400
    return caught.value


def test_the_guide_request_sets_the_template_inputs_it_maps(loras):
    template = _template("qwen_image_lightning", "qwen-image")
    request = parse_chat(GUIDE_BODY, {"qwen-image": template})
    prompt = fill_in(template, request.values, request.adapters)
    assert prompt["2"]["inputs"]["text"] == "A Chinese female college student"
    assert (prompt["4"]["inputs"]["width"], prompt["4"]["inputs"]["height"]) == (1024, 1024)
    assert {k: prompt["6"]["inputs"][k] for k in ("steps", "cfg", "seed")} == {"steps": 4, "cfg": 1.0, "seed": 42}
    assert template.prompt["4"]["inputs"]["width"] == 32  # the template itself is untouched


def test_extra_body_fields_sent_at_the_top_level_map_the_same(loras):
    """The ``openai`` client merges ``extra_body`` into the top level; curl sends it as an object."""
    template = _template("qwen_image_lightning")
    flat = {"messages": GUIDE_BODY["messages"], **GUIDE_BODY["extra_body"]}
    assert parse_chat(flat, {"m": template}).values == parse_chat(GUIDE_BODY, {"m": template}).values


@pytest.mark.parametrize("body, param, words", [
    ({**GUIDE_BODY, "seed": 1}, "seed", "both at the top level and in extra_body"),
    ({"messages": GUIDE_BODY["messages"], "num_frames": 5}, "num_frames", "does not use this field"),
    ({"messages": GUIDE_BODY["messages"], "flow_shiftx": 5}, "flow_shiftx", "unknown request field"),
    ({"messages": GUIDE_BODY["messages"], "model": "sdxl"}, "model", "'sdxl' is not served; served models: m"),
    ({"messages": GUIDE_BODY["messages"], "seed": "forty"}, "seed", "expected an integer"),
    ({"messages": GUIDE_BODY["messages"], "stream": True}, "stream", "streaming is not supported"),
    ({"messages": [{"role": "system", "content": "x"}]}, "messages", "no user message"),
])
def test_chat_refusals_name_the_field(loras, body, param, words):
    error = _refusal(parse_chat, body, {"m": _template("qwen_image_lightning")})
    assert error.param == param and words in error.message


def test_images_take_size_and_refuse_a_bad_one(loras):
    models = {"m": _template("qwen_image_lightning")}
    request = parse_images({"prompt": "a dog", "size": "64x48", "n": 2, "seed": 3}, models)
    assert (request.values["width"], request.values["height"], request.count) == (64, 48, 2)
    assert _refusal(parse_images, {"prompt": "a dog", "size": "big"}, models).param == "size"
    assert _refusal(parse_images, {"prompt": "a dog", "n": 11}, models).param == "n"
    assert _refusal(parse_images, {"prompt": "a dog", "quality": "hd"}, models).param == "quality"
    assert _refusal(parse_images, {"prompt": "a dog", "response_format": "png"}, models).param == "response_format"


def test_a_video_template_is_served_by_the_video_endpoint_only(loras):
    models = {"wan": _template("wan22_lightx2v_4step", "wan")}
    assert models["wan"].is_video and not _template("qwen_image_lightning").is_video
    # the openai client posts videos.create as a multipart form: every value is text
    request = parse_video({"prompt": "a fox", "model": "wan", "size": "32x32", "num_frames": "9", "fps": "16"},
                          models)
    assert request.values == {"prompt": "a fox", "width": 32, "height": 32, "num_frames": 9, "fps": 16.0}
    assert "POST /v1/videos" in _refusal(parse_images, {"prompt": "x"}, models).message
    assert _refusal(parse_video, {"prompt": "x", "seconds": "4"}, models).param == "seconds"


def test_request_adapters_are_chained_into_the_adapter_hook(loras):
    template = _template("qwen_image_lightning")
    body = {"prompt": "a dog", "lora": [{"name": "ink", "path": "styles/ink", "scale": 0.5, "int_id": 7},
                                        {"path": str(loras / "loras" / "detail.safetensors")}]}
    request = parse_images(body, {"m": template})
    assert request.adapters == [("styles/ink", 0.5), ("detail.safetensors", 1.0)]
    prompt = fill_in(template, request.values, request.adapters)
    second_id, _ = prompt["6"]["inputs"]["adapter"]
    second = prompt[second_id]
    first = prompt[second["inputs"]["adapter"][0]]
    assert (first["class_type"], first["inputs"]["lora_name"], first["inputs"]["scale"]) == (
        "LoadPEFTAdapter", "styles/ink", 0.5)
    assert second["inputs"]["lora_name"] == "detail.safetensors" and "adapter" not in first["inputs"]


@pytest.mark.parametrize("path, code", [("../elsewhere.safetensors", "lora_path_not_allowed"),
                                        ("/etc/passwd", "lora_path_not_allowed"),
                                        ("missing.safetensors", "lora_not_found")])
def test_an_adapter_path_outside_the_lora_folders_is_refused(loras, path, code):
    error = _refusal(confined_lora_name, path)
    assert (error.param, error.code) == ("lora.path", code)


def test_a_link_inside_the_lora_folder_pointing_out_is_refused(loras, tmp_path):
    os.symlink(tmp_path / "elsewhere.safetensors", loras / "loras" / "linked.safetensors")
    assert _refusal(confined_lora_name, str(loras / "loras" / "linked.safetensors")).code == "lora_path_not_allowed"


def test_an_allowed_lora_dir_admits_its_files(loras, tmp_path):
    from lorabind.runtime import folder_paths

    folder_paths.add_model_folder_path("loras", str(tmp_path))
    assert confined_lora_name(str(tmp_path / "elsewhere.safetensors")) == "elsewhere.safetensors"


def test_a_template_mapping_an_unknown_field_or_input_is_refused_at_start(tmp_path, loras):
    prompt = json.loads((WORKFLOWS / "qwen_image_lightning.api.json").read_text())
    prompt["6"]["_meta"]["openai"]["steps_count"] = "steps"
    bad = tmp_path / "bad.api.json"
    bad.write_text(json.dumps(prompt))
    with pytest.raises(ValueError, match="bad.api.json: node 6 maps unknown request field 'steps_count'"):
        load_template("m", str(bad), NODE_CLASSES)
    del prompt["6"]["_meta"]["openai"]["steps_count"]
    prompt["6"]["_meta"]["openai"]["seed"] = "noise_seed"
    bad.write_text(json.dumps(prompt))
    with pytest.raises(ValueError, match="node 6 \\(LoraBindSampler\\) has no input 'noise_seed'"):
        load_template("m", str(bad), NODE_CLASSES)


def test_a_validation_error_names_the_request_field(loras):
    template = _template("qwen_image_lightning")
    reason = "height 100000 is outside 16..8192"
    errors = [{"type": "custom_validation_failed", "message": "Custom validation failed for node",
               "details": f"{name} - {reason}", "extra_info": {"input_name": name}} for name in ("width", "height")]
    result = SimpleNamespace(node_errors={"4": {"errors": errors, "class_type": "LoraBindEmptyLatent"}}, error={})
    error = validation_error(template, template.prompt, result)
    assert error.param == "height" and reason in error.message


def test_a_contract_mismatch_is_a_400_naming_the_file_and_the_field(loras):
    template = _template("qwen_image_lightning")
    message = "Qwen-Image-Lightning-4steps-V1.0.safetensors is a 4-step distill LoRA: steps must be 4, got 20"
    entry = {"status": {"status_str": "error", "messages": [["execution_error", {
        "node_id": "6", "node_type": "LoraBindSampler", "exception_message": message,
        "exception_type": "lorabind.loaders.errors.ContractError"}]]}}
    error = failure(template, entry)
    assert (error.status, error.param, error.code) == (400, "num_inference_steps", "contract_mismatch")
    assert "Qwen-Image-Lightning-4steps-V1.0.safetensors" in error.message
    entry["status"]["messages"][0][1]["exception_type"] = "RuntimeError"
    assert failure(template, entry).status == 500


@pytest.mark.parametrize("args, words", [
    (["--openai-model", "qwen-image"], "expected NAME=WORKFLOW.api.json"),
    (["--openai-model", "m=x.api.json", "--allow-lora-dir", "/no/such/folder"], "not a folder"),
])
def test_serve_refuses_bad_openai_flags_before_starting(args, words, capsys):
    from lorabind.runtime.cli import main

    assert main(["serve", *args]) == 2
    assert words in capsys.readouterr().out
