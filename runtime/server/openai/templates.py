"""Served models as workflow templates: an API workflow whose nodes say, in their ``_meta``, which request
fields set which of their inputs.

Why templates instead of a model name: a served "model" here is a whole graph (model, LoRAs, sampler, decode,
save), exactly what ``/prompt`` runs, so the OpenAI-style endpoints fill in a template and queue it like any
prompt: one execution path. A node opts in with ``"_meta": {"openai": {REQUEST_FIELD: INPUT_NAME}}``, e.g. the
positive text encoder ``{"prompt": "text"}`` and the sampler ``{"num_inference_steps": "steps", "seed":
"seed", "lora": "adapter", "distill_lora": "model"}``. Request fields use vllm-omni's names (``FIELDS``); the two
hooks name where per-request adapters and the server's distill LoRAs are chained in.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field
from pathlib import Path

from ....loaders.io import json_limits
from .errors import OpenAIRequestError
from .repositories import repository_template, served_repositories

# request field -> the Python type its value must have (vllm-omni's names; ``size`` arrives split into these)
FIELDS = {
    "prompt": str, "negative_prompt": str, "width": int, "height": int, "num_frames": int, "fps": float,
    "num_inference_steps": int, "true_cfg_scale": float, "guidance_scale": float, "guidance_scale_2": float,
    "seed": int, "image": str,
    # the guides' sampling fields (vllm-omni's and LightX2V's names; ``sampling_fields`` reads two of them)
    "flow_shift": float, "boundary_ratio": float, "sample_solver": str, "guidance_scale_high": float,
    "audio_flow_shift": float, "task": str,
}
ADAPTER_HOOK = "lora"  # the input (an adapter socket) that per-request PEFT adapters are chained into
DISTILL_HOOK = "distill_lora"  # the input (a model socket) that --lora-backend distill files are chained into
HOOKS = (ADAPTER_HOOK, DISTILL_HOOK)
ADAPTER_NODE = "LoadPEFTAdapter"  # the node a per-request adapter becomes
VIDEO_FIELD = "num_frames"  # a template that lets requests choose a frame count makes videos
_KIND_WORDS = {int: "an integer", float: "a number", str: "a string"}


@dataclass
class Template:
    """One served model: its name, the prompt to fill in and where each request field goes."""

    name: str
    file_name: str  # the template's file name (not its path: it appears in answers to clients)
    prompt: dict
    bindings: dict[str, list[tuple[str, str]]]  # request field -> [(node id, input name)]
    hooks: dict[str, tuple[str, str]] = field(default_factory=dict)  # hook -> (node id, input name)
    adapter_defaults: dict = field(default_factory=dict)  # the adapter node's declared input defaults

    @property
    def is_video(self) -> bool:
        return VIDEO_FIELD in self.bindings

    def fields_of(self, node_id: str, sent=None) -> dict[str, str]:
        """{input name: request field} of one node (to name the request field in a node's error). ``sent``
        ({field the values set: the name the request gave it}, ``GenerationRequest.sent``) picks the field the
        request gave where two set one input (``guidance_scale`` and ``guidance_scale_high`` both set a
        sampler's cfg), under the name it was given."""
        sent = sent or {}
        fields: dict[str, str] = {}
        for request_field, targets in self.bindings.items():
            for target_node, input_name in targets:
                if target_node == node_id and (input_name not in fields or request_field in sent):
                    fields[input_name] = sent.get(request_field, request_field)
        return fields

    def default_of(self, request_field: str):
        """The template's own value for a request field (its first target input)."""
        node_id, input_name = self.bindings[request_field][0]
        return self.prompt[node_id]["inputs"].get(input_name)


def parse_model_option(option: str) -> tuple[str, str]:
    """``NAME=WORKFLOW.api.json`` -> (name, path); a repository id (``Wan-AI/Wan2.2-T2V-A14B-Diffusers``) ->
    (the id, the real-size workflow that serves it); ValueError naming the expected shapes."""
    name, sep, path = option.partition("=")
    if not sep and option.strip():
        template = repository_template(option.strip())
        if template is not None:
            return option.strip(), str(template)
        raise ValueError(f"--openai-model {option!r}: expected NAME=WORKFLOW.api.json, or a repository id served "
                         f"through its real-size workflow ({', '.join(served_repositories())})")
    if not sep or not name.strip() or not path.strip():
        raise ValueError(f"--openai-model {option!r}: expected NAME=WORKFLOW.api.json")
    return name.strip(), path.strip()


def load_template(name: str, path: str, node_classes: dict) -> Template:
    """Read and check a template; ValueError naming the file, node and field for anything a request could not use."""
    file_name = Path(path).name
    try:
        prompt = json_limits.loads(Path(path).read_bytes())
    except (OSError, ValueError) as exc:
        raise ValueError(f"--openai-model {name}: cannot read {path}: {exc}") from None
    if not isinstance(prompt, dict) or not prompt or not all(
            isinstance(node, dict) and isinstance(node.get("inputs"), dict) for node in prompt.values()):
        raise ValueError(f"--openai-model {name}: {file_name} is not an API workflow (node id -> {{class_type, "
                         "inputs}}); export it with ComfyUI's 'Export (API)'")
    template = Template(name, file_name, prompt, {}, adapter_defaults=_declared_defaults(node_classes,
                                                                                         ADAPTER_NODE))
    for node_id, node in prompt.items():
        declared = (node.get("_meta") or {}).get("openai") or {}
        if not isinstance(declared, dict):
            raise ValueError(f"{file_name}: node {node_id} _meta.openai must map request fields to input names")
        for request_field, input_name in declared.items():
            _check_binding(file_name, node_id, node, request_field, input_name, node_classes)
            if request_field in HOOKS:
                if request_field in template.hooks:
                    raise ValueError(f"{file_name}: the {request_field!r} hook is declared twice")
                template.hooks[request_field] = (node_id, input_name)
            else:
                template.bindings.setdefault(request_field, []).append((node_id, input_name))
    if "prompt" not in template.bindings:
        raise ValueError(f"{file_name}: no node maps the request field 'prompt' (add \"_meta\": {{\"openai\": "
                         "{\"prompt\": \"text\"}} to the positive text encoder)")
    return template


def _declared_defaults(node_classes: dict, class_type: str) -> dict:
    """{input: default} of a node's required inputs that declare one (what a new node of it gets)."""
    node_class = node_classes.get(class_type)
    required = node_class.INPUT_TYPES().get("required", {}) if node_class is not None else {}
    return {name: spec[1]["default"] for name, spec in required.items()
            if len(spec) > 1 and isinstance(spec[1], dict) and "default" in spec[1]}


def _check_binding(file_name: str, node_id: str, node: dict, request_field, input_name, node_classes) -> None:
    if request_field not in FIELDS and request_field not in HOOKS:
        raise ValueError(f"{file_name}: node {node_id} maps unknown request field {request_field!r} (known: "
                         f"{', '.join([*FIELDS, *HOOKS])})")
    node_class = node_classes.get(node.get("class_type"))
    if node_class is None:
        raise ValueError(f"{file_name}: node {node_id} has unknown class {node.get('class_type')!r}")
    declared = node_class.INPUT_TYPES()
    known = {**declared.get("required", {}), **declared.get("optional", {})}
    if input_name not in known:
        raise ValueError(f"{file_name}: node {node_id} ({node['class_type']}) has no input {input_name!r} for "
                         f"request field {request_field!r} (inputs: {', '.join(known)})")


def fill_in(template: Template, values: dict, adapters: list[tuple[str, float]]) -> dict:
    """The prompt for one request: the template with each given field's inputs set and the request's adapters
    chained into the adapter hook (after any adapter the template already connects there)."""
    prompt = copy.deepcopy(template.prompt)
    for request_field, value in values.items():
        for node_id, input_name in template.bindings[request_field]:
            prompt[node_id]["inputs"][input_name] = value
    if adapters:
        node_id, input_name = template.hooks[ADAPTER_HOOK]
        upstream = prompt[node_id]["inputs"].get(input_name)
        for lora_name, scale in adapters:
            inputs = {**template.adapter_defaults, "lora_name": lora_name, "scale": scale,
                      **({"adapter": upstream} if upstream else {})}
            upstream = [add_node(prompt, ADAPTER_NODE, inputs, f"request adapter {lora_name}"), 0]
        prompt[node_id]["inputs"][input_name] = upstream
    return prompt


def add_node(prompt: dict, class_type: str, inputs: dict, title: str) -> str:
    """Add a node under the next free numeric id; returns the id."""
    numeric = [int(node_id) for node_id in prompt if str(node_id).isdigit()]
    node_id = str(max(numeric, default=0) + 1)
    prompt[node_id] = {"class_type": class_type, "inputs": inputs, "_meta": {"title": title}}
    return node_id


def typed_value(name: str, value, kind: type):
    """The value as the field's type (400 naming the field otherwise); multipart forms send every value as text,
    which is converted."""
    sent = value
    if isinstance(value, str) and kind is not str:
        try:
            value = kind(value.strip())
        except ValueError:
            pass
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        try:
            value = float(value)
        except OverflowError:  # an integer of hundreds of digits: no float holds it
            value = math.inf
    if kind is int and isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, kind) or (kind is float and not math.isfinite(value)):
        raise OpenAIRequestError(f"{name}: expected {_KIND_WORDS[kind]}, got {_shown(sent)}", param=name)
    return value


def _shown(value) -> str:
    """A refused value in a message: its repr, or its start and length when long (a 400-digit number)."""
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:40]}... ({len(text)} characters)"


def check_values(template: Template, values: dict) -> None:
    """Refuse (by name) request fields the template does not map."""
    for request_field in values:
        if request_field not in template.bindings:
            mapped = ", ".join(sorted(template.bindings))
            raise OpenAIRequestError(
                f"{request_field}: model {template.name!r} does not use this field (its template "
                f"{template.file_name} maps: {mapped})", param=request_field, code="unsupported_field")


def describe(template: Template) -> str:
    """One line for the server's start-up output."""
    kind = "video" if template.is_video else "image"
    return f"{template.name} ({kind}, {template.file_name}): {', '.join(sorted(template.bindings))}"

