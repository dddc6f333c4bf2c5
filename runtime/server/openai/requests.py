"""Request bodies of the ``/v1`` endpoints -> ``GenerationRequest`` (which template, which values, which adapters).

Field names are vllm-omni's and OpenAI's. Generation fields may come at the top level (what the ``openai``
client sends for ``extra_body``) or inside a literal ``extra_body`` object (what vllm-omni's curl examples
send); the same field in both is refused, as vllm-omni does. Every field must be known: an endpoint field, a
field the model's template maps, ``lora`` or ``client_id``; anything else is refused by name.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Optional

from .. import identifiers
from .errors import OpenAIRequestError
from .loras import request_adapters
from .sampling_fields import check_shifts, read_sampling_fields
from .templates import FIELDS, Template, check_values, typed_value

MAX_IMAGES_PER_REQUEST = 10  # OpenAI's own limit for ``n``
CHAT_FIELDS = frozenset({"model", "messages", "stream", "n", "user", "modalities"})
IMAGE_FIELDS = frozenset({"model", "prompt", "n", "size", "response_format", "user"})
VIDEO_FIELDS = frozenset({"model", "prompt", "size", "seconds", "user"})
RESPONSE_FORMATS = ("b64_json", "url")
_SIDE = re.compile(r"[0-9]{1,6}")  # a size's width or height; the template's own bounds are checked after


@dataclass
class GenerationRequest:
    template: Template
    values: dict  # request field -> value, only fields the template maps
    adapters: list = field(default_factory=list)  # [(LoRA name, scale)]
    client_id: Optional[str] = None  # the WebSocket client that receives the prompt's progress
    count: int = 1  # ``n``: that many prompts, seeds seed, seed+1, ...
    response_format: str = "b64_json"
    sent: dict = field(default_factory=dict)  # field in values -> the name the request gave it (errors name it)


def parse_chat(body: dict, models: dict[str, Template]) -> GenerationRequest:
    endpoint, generation = _split(body, CHAT_FIELDS)
    if endpoint.get("stream"):
        raise OpenAIRequestError("stream: streaming is not supported; send stream=false (the default)",
                                 param="stream")
    template = pick_model(models, endpoint.get("model"))
    _set_once(generation, "prompt", _last_user_text(endpoint.get("messages")), "messages")
    return _request(template, generation, count=_count(endpoint.get("n", 1)))


def parse_images(body: dict, models: dict[str, Template]) -> GenerationRequest:
    endpoint, generation = _split(body, IMAGE_FIELDS)
    template = pick_model(models, endpoint.get("model"))
    if template.is_video:
        raise OpenAIRequestError(f"model: {template.name!r} makes videos; use POST /v1/videos", param="model")
    _set_once(generation, "prompt", endpoint.get("prompt"), "prompt")
    if "size" in endpoint:
        generation["size"] = endpoint["size"]
    response_format = endpoint.get("response_format") or "b64_json"
    if response_format not in RESPONSE_FORMATS:
        raise OpenAIRequestError(f"response_format: expected one of {', '.join(RESPONSE_FORMATS)}, got "
                                 f"{response_format!r}", param="response_format")
    request = _request(template, generation, count=_count(endpoint.get("n", 1)))
    request.response_format = response_format
    return request


def parse_video(body: dict, models: dict[str, Template]) -> GenerationRequest:
    """``POST /v1/videos``: JSON, or the multipart form the ``openai`` client sends (every value a string)."""
    endpoint, generation = _split(body, VIDEO_FIELDS)
    template = pick_model(models, endpoint.get("model"))
    if not template.is_video:
        raise OpenAIRequestError(f"model: {template.name!r} makes images; use POST /v1/images/generations",
                                 param="model")
    if endpoint.get("seconds") is not None:
        raise OpenAIRequestError("seconds: lorabind sets a clip's length in frames; send num_frames (and fps) "
                                 "instead", param="seconds")
    _set_once(generation, "prompt", endpoint.get("prompt"), "prompt")
    if "size" in endpoint:
        generation["size"] = endpoint["size"]
    return _request(template, generation)


def pick_model(models: dict[str, Template], requested) -> Template:
    """The template a request names; with one served model, ``model`` may be left out (as with vllm-omni)."""
    if requested is None and len(models) == 1:
        return next(iter(models.values()))
    if requested is not None and not isinstance(requested, str):
        raise OpenAIRequestError(f"model: expected a model name (a string), got {type(requested).__name__}",
                                 param="model")
    if requested in models:
        return models[requested]
    served = ", ".join(sorted(models)) or "none (start the server with --openai-model NAME=WORKFLOW.api.json)"
    what = "model is required" if requested is None else f"model {requested!r} is not served"
    raise OpenAIRequestError(f"{what}; served models: {served}", param="model", code="model_not_found")


def _split(body: dict, endpoint_fields: frozenset) -> tuple[dict, dict]:
    """(endpoint fields, generation fields) from the top level and ``extra_body`` together."""
    nested = body.get("extra_body") or {}
    if not isinstance(nested, dict):
        raise OpenAIRequestError("extra_body: expected an object", param="extra_body")
    root = {key: value for key, value in body.items() if key != "extra_body"}
    twice = sorted(root.keys() & nested.keys())
    if twice:
        raise OpenAIRequestError(f"{twice[0]}: given both at the top level and in extra_body; give it once",
                                 param=twice[0])
    merged = {**root, **nested}
    endpoint = {key: merged.pop(key) for key in list(merged) if key in endpoint_fields}
    return endpoint, merged


def _request(template: Template, generation: dict, count: int = 1) -> GenerationRequest:
    adapters = request_adapters(generation.pop("lora"), template) if "lora" in generation else []
    client_id = generation.pop("client_id", None)
    if client_id is not None and not identifiers.is_well_formed(client_id):
        raise OpenAIRequestError(f"client_id: expected the WebSocket clientId, {identifiers.RULE}",
                                 param="client_id")
    if "size" in generation:
        _split_size(generation)
    for name in generation:
        if name not in FIELDS:
            raise OpenAIRequestError(f"{name}: unknown request field", param=name, code="unknown_field")
    check_values(template, generation)
    renamed = read_sampling_fields(template, generation)
    values = {name: typed_value(renamed.get(name, name), value, FIELDS[name]) for name, value in generation.items()}
    check_shifts(values, renamed)
    if count > 1 and "seed" not in template.bindings:
        raise OpenAIRequestError(f"n: model {template.name!r} maps no seed, so its {count} images would be the same",
                                 param="n")
    return GenerationRequest(template, values, adapters, client_id, count,
                             sent={name: renamed.get(name, name) for name in values})


def _split_size(generation: dict) -> None:
    size = generation.pop("size")
    if "width" in generation or "height" in generation:
        raise OpenAIRequestError("size: give either size or width and height", param="size")
    width, sep, height = str(size).lower().partition("x")
    # ASCII digits only (str.isdigit() accepts superscripts, which int() refuses), and few enough for int()
    if not (sep and _SIDE.fullmatch(width) and _SIDE.fullmatch(height)):
        shown = repr(size) if len(str(size)) <= 40 else f"{str(size)[:40]!r}... ({len(str(size))} characters)"
        raise OpenAIRequestError(f"size: expected WIDTHxHEIGHT such as 1024x1024, got {shown}", param="size")
    generation["width"], generation["height"] = int(width), int(height)


def _count(n) -> int:
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_IMAGES_PER_REQUEST:
        raise OpenAIRequestError(f"n: expected an integer from 1 to {MAX_IMAGES_PER_REQUEST}, got {n!r}", param="n")
    return n


def _set_once(generation: dict, name: str, value, source: str) -> None:
    if value is None:
        raise OpenAIRequestError(f"{source}: required", param=source)
    if name in generation:
        raise OpenAIRequestError(f"{name}: given twice (also by {source})", param=name)
    generation[name] = value


def _last_user_text(messages) -> Optional[str]:
    """The prompt of a chat request: the text of its last user message (string content or text parts)."""
    if not isinstance(messages, list) or not messages:
        raise OpenAIRequestError("messages: expected a non-empty list of {role, content}", param="messages")
    users = [m for m in messages if isinstance(m, dict) and m.get("role") == "user"]
    if not users:
        raise OpenAIRequestError("messages: no user message to take the prompt from", param="messages")
    content = users[-1].get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        kinds = {part.get("type") for part in content if isinstance(part, dict)}
        if kinds - {"text"}:
            raise OpenAIRequestError(f"messages: content parts of type {sorted(kinds - {'text'})} are not "
                                     "supported; send the prompt as text", param="messages")
        return "\n".join(str(part.get("text", "")) for part in content)
    raise OpenAIRequestError("messages: a user message's content must be text", param="messages")
