"""Issue 46: what a client gets wrong on ``/v1`` is a 400 in OpenAI's error shape, never a 500, and an ``n > 1``
request refused for a later image queues none of them."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from types import SimpleNamespace

import pytest

import lorabind
from lorabind.runtime.core_nodes import runtime_node_classes
from lorabind.runtime.server.openai import routes
from lorabind.runtime.server.openai.errors import OpenAIRequestError
from lorabind.runtime.server.openai.loras import confined_lora_name
from lorabind.runtime.server.openai.requests import parse_images
from lorabind.runtime.server.openai.templates import load_template
from server_client import Client, run_async

WORKFLOWS = Path(lorabind.__file__).parent / "workflows" / "api"


@pytest.fixture
def models(registry_at, tmp_path):
    (tmp_path / "models" / "loras").mkdir(parents=True)
    registry_at(tmp_path / "models")
    template = load_template("m", str(WORKFLOWS / "qwen_image_lightning.api.json"), runtime_node_classes()[0])
    return {"m": template}


def _refused(call, *args) -> OpenAIRequestError:
    with pytest.raises(OpenAIRequestError) as caught:
        call(*args)
    assert caught.value.status == 400
    return caught.value


@pytest.mark.parametrize("size", ["²x²", "1" * 5000 + "x64", "64x" + "9" * 7, "٣٢x32"])
def test_a_size_that_is_not_ascii_digits_or_is_too_long_is_a_400(models, size):
    error = _refused(parse_images, {"prompt": "a dog", "size": size}, models)
    assert error.param == "size" and "expected WIDTHxHEIGHT" in error.message and len(error.message) < 200


def test_a_size_at_six_digits_reaches_the_template_bounds(models):
    request = parse_images({"prompt": "a dog", "size": "999999x64"}, models)
    assert request.values["width"] == 999999  # then refused by the node's own bounds at validation


@pytest.mark.parametrize("model", [["m"], {"m": 1}, 3])
def test_a_model_that_is_not_a_string_is_a_400(models, model):
    error = _refused(parse_images, {"prompt": "a dog", "model": model}, models)
    assert error.param == "model" and "expected a model name" in error.message


def test_a_nul_in_lora_path_is_a_400(models):
    error = _refused(confined_lora_name, "detail\0.safetensors")
    assert error.param == "lora.path" and "NUL" in error.message


def test_a_fifo_as_lora_path_is_named_for_what_it_is(models, tmp_path):
    fifo = tmp_path / "models" / "loras" / "pipe.safetensors"
    os.mkfifo(fifo)
    error = _refused(confined_lora_name, "pipe.safetensors")
    assert "is not a file or a folder" in error.message and "same name" not in error.message


def test_n_images_are_all_validated_before_any_is_queued(models, monkeypatch):
    validated, queued = [], []

    async def validate(state, template, prompt, sent=None, client_id=None):
        validated.append(prompt)
        if len(validated) == 2:  # the second image's seed is past the maximum
            raise OpenAIRequestError("seed: 18446744073709551616 is over the maximum", param="seed")
        return SimpleNamespace(ok=True, outputs=["8"])

    async def queue(*args):
        queued.append(args)
        return "id", asyncio.get_running_loop().create_future()

    monkeypatch.setattr(routes, "validated", validate)
    monkeypatch.setattr(routes, "queue_prompt", queue)
    monkeypatch.setattr(routes, "service_of", lambda request: (SimpleNamespace(watcher=None), None))
    generation = parse_images({"prompt": "a dog", "n": 3, "seed": 0xFFFF_FFFF_FFFF_FFFF}, models)
    with pytest.raises(OpenAIRequestError, match="seed"):
        asyncio.run(routes.run_to_end(None, generation, "images.generations"))
    assert len(validated) == 2 and queued == []


def test_a_prompt_posing_as_a_video_job_with_a_list_as_model_is_reported_not_500(server):
    async def run():
        client = Client(server.url)
        try:
            await client.connect()
            answer = await client.queue_prompt({"1": {"class_type": "SrvFail", "inputs": {"value": 3}}},
                                               extra_data={"lorabind_openai": {"endpoint": "videos", "model": ["x"]}})
            await client.wait_done(answer["prompt_id"])
            return await client.get(f"/v1/videos/{answer['prompt_id']}")
        finally:
            await client.close()

    status, body = run_async(run)
    assert status == 200 and body["status"] == "failed" and body["error"]["message"] == "the job failed"
