"""OpenAI-style endpoints beside ComfyUI's API: ``/v1/models``, ``/v1/chat/completions`` (vllm-omni's shape),
``/v1/images/generations`` and the video job API (``/v1/videos``).

Each request fills in its model's workflow template (``templates``) and queues it like ``POST /prompt``
(``jobs``); chat and image requests wait for the history entry and answer with the files, a video
request answers with the job at once. Errors use OpenAI's shape (``errors``). Streaming is not offered.
"""

from __future__ import annotations

import json
import logging
import time

from aiohttp import web

from ..comfy_api.prompt_service import validate_prompt
from ..composition_root import ServerState
from ..queue import QueueItem
from . import video_routes
from .errors import OpenAIRequestError
from .jobs import JobWatcher, describe_request, queue_prompt, template_value, validated
from .loras import attach_distill
from .requests import GenerationRequest, parse_chat, parse_images
from .results import ResultFile, failure, result_files
from .service import OPENAI_KEY, OpenAIService, origin, read_body, service_of
from .templates import Template, describe, fill_in, load_template

log = logging.getLogger("lorabind.server")


def register(app: web.Application, state: ServerState) -> None:
    """Load the ``--openai-model`` templates (ValueError naming the file for a bad one), attach the distill
    files, queue their warm-up, and add the routes."""
    models: dict[str, Template] = {}
    for name, path in state.config.openai_models:
        if name in models:
            raise ValueError(f"--openai-model {name}: served twice")
        models[name] = load_template(name, path, state.node_classes)
    lines = [f"  openai: {describe(template)}" for template in models.values()]
    service = OpenAIService(models, JobWatcher(state), lines)
    if state.config.distill_loras:
        fused = attach_distill(list(models.values()), state.config.distill_loras, state.config.models_root,
                               state.config.input_dir)
        for template, names, warnings in fused:
            lines.append(f"  distill: {template.name} fuses {', '.join(names)} for the server's lifetime")
            lines += [f"  warning: {warning}" for warning in warnings]
            for warning in warnings:
                log.warning("%s", warning)
        _queue_warm_ups(state, [template for template, _, _ in fused])
    app[OPENAI_KEY] = service
    for method, path, handler in (("GET", "/v1/models", list_models),
                                  ("POST", "/v1/chat/completions", chat_completions),
                                  ("POST", "/v1/images/generations", images_generations)):
        app.router.add_route(method, path, handler)
    video_routes.register(app)


def startup_lines(app: web.Application) -> list[str]:
    """What ``lorabind serve`` prints about the served templates and the distill files."""
    return app[OPENAI_KEY].lines


def _queue_warm_ups(state: ServerState, templates: list[Template]) -> None:
    """Fuse the distill files now, not at the first request: each template with them runs once as it stands
    (steps 0: the count the files declare), through the queue like any prompt (vllm-omni fuses at start too)."""
    for template in templates:
        prompt = fill_in(template, {}, [])
        result = validate_prompt(state, prompt, None)
        if not result.ok:
            raise ValueError(f"--lora-path: the template of {template.name} ({template.file_name}) does not "
                             f"validate with the distill files: {json.dumps(result.node_errors or result.error)}")
        prompt_id = f"warm-up-{template.name}-{int(time.time())}"
        extra = {"create_time": int(time.time() * 1000), "lorabind_openai": {"endpoint": "warm-up",
                                                                             "model": template.name}}
        state.queue.put(QueueItem(state.queue.next_number(), prompt_id, prompt, extra, list(result.outputs)))
        log.info("prompt %s queued: fuses the --lora-path files into %s before the first request", prompt_id,
                 template.name)


async def run_to_end(request: web.Request, generation: GenerationRequest, endpoint: str) -> list[ResultFile]:
    """Queue the request's prompts (``n`` of them, seeds counting up) and wait for all; their files, in order.
    All ``n`` are validated before any is queued: a refusal of a later one (its seed past the maximum) must not
    leave the earlier ones running."""
    service, state = service_of(request)
    template = generation.template
    prompts = []
    for index in range(generation.count):
        values = dict(generation.values)
        if index:
            values["seed"] = values.get("seed", template_value(template, "seed")) + index
        prompt = fill_in(template, values, generation.adapters)
        description = describe_request(endpoint, template, values, generation.sent)
        prompts.append((prompt, description, await validated(state, template, prompt, description.get("fields"),
                                                                 generation.client_id)))
    queued = [await queue_prompt(state, service.watcher, template, prompt, description, generation.client_id, result)
              for prompt, description, result in prompts]
    files = []
    for _, future in queued:
        entry = await future
        if (entry.get("status") or {}).get("status_str") != "success":
            raise failure(template, entry, generation.sent)
        files += result_files(entry, state.config)
    if not files:
        raise OpenAIRequestError(f"the template {template.file_name} saved no image or video", status=500)
    return files


async def list_models(request: web.Request) -> web.Response:
    service, _ = service_of(request)
    return web.json_response({"object": "list", "data": [
        {"id": name, "object": "model", "created": service.started, "owned_by": "lorabind"}
        for name in sorted(service.models)]})


async def chat_completions(request: web.Request) -> web.Response:
    """vllm-omni's image chat: the picture as a data URL in ``choices[0].message.content[0].image_url.url``;
    a video comes as a link (``video_url``) to ``/view``."""
    try:
        generation = parse_chat(await read_body(request), service_of(request)[0].models)
        files = await run_to_end(request, generation, "chat.completions")
    except OpenAIRequestError as exc:
        return exc.response()
    content = [{"type": "video_url", "video_url": {"url": item.view_url(origin(request))}} if item.animated
               else {"type": "image_url", "image_url": {"url": item.data_url()}} for item in files]
    return web.json_response({
        "id": f"chatcmpl-{int(time.time() * 1000)}", "object": "chat.completion", "created": int(time.time()),
        "model": generation.template.name,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}})


async def images_generations(request: web.Request) -> web.Response:
    try:
        generation = parse_images(await read_body(request), service_of(request)[0].models)
        files = await run_to_end(request, generation, "images.generations")
    except OpenAIRequestError as exc:
        return exc.response()
    if generation.response_format == "url":
        data = [{"url": item.view_url(origin(request))} for item in files]
    else:
        data = [{"b64_json": item.b64()} for item in files]
    return web.json_response({"created": int(time.time()), "data": data})

