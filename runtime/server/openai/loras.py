"""LoRA the vllm-omni way: per-request PEFT adapters (``lora`` in the request) and the server-lifetime distill
files of ``--lora-backend distill --lora-path FILE...``.

Both become ordinary nodes of the prompt (``LoadPEFTAdapter``; ``FuseDistillLoRA`` or ``WanMoELoRAPair``), so the
sampler binds them incrementally like any workflow: distill files fused once stay fused across requests, and an
adapter is switched on and off around them without touching the fused weights. A request names an adapter by a
server-side path (vllm-omni's ``lora.path``); it must lie inside the LoRA folders (``<models>/loras`` and the
``--allow-lora-dir`` ones), symlinks resolved, and is handed to the node as its name in that folder.
"""

from __future__ import annotations

import os

from ....loaders import families
from ....loaders.dispatch.contract_discovery import contract_to_dict, discover_contract
from ....loaders.errors import LoraBindError
from ....loaders.families.roles import ROLE_HIGH_NOISE, ROLE_LOW_NOISE
from ....loaders.lora import read_lora
from ....loaders.models.structure import load_structure
from ....tiny_models import ensure_builtin_models
from ... import folder_paths
from .errors import OpenAIRequestError
from .templates import ADAPTER_HOOK, DISTILL_HOOK, Template, add_node, typed_value

MAX_REQUEST_ADAPTERS = 8
# vllm-omni's lora object: name, path (or local_path), scale, int_id (its cache key; ours is the file itself)
_LORA_KEYS = ("name", "path", "local_path", "scale", "int_id")


def request_adapters(value, template: Template) -> list[tuple[str, float]]:
    """``[(name under the LoRA folders, scale)]`` from a request's ``lora`` (one object or a list of them)."""
    entries = value if isinstance(value, list) else [value]
    if not entries or len(entries) > MAX_REQUEST_ADAPTERS:
        raise OpenAIRequestError(f"lora: give 1 to {MAX_REQUEST_ADAPTERS} adapters", param="lora")
    if ADAPTER_HOOK not in template.hooks:
        raise OpenAIRequestError(f"lora: model {template.name!r} takes no per-request adapters (its template "
                                 f"{template.file_name} declares no 'lora' hook)", param="lora")
    return [_adapter(entry) for entry in entries]


def _adapter(entry) -> tuple[str, float]:
    if not isinstance(entry, dict):
        raise OpenAIRequestError("lora: expected an object {name, path, scale}", param="lora")
    unknown = sorted(set(entry) - set(_LORA_KEYS))
    if unknown:
        raise OpenAIRequestError(f"lora.{unknown[0]}: unknown field (a lora object has {', '.join(_LORA_KEYS)})",
                                 param=f"lora.{unknown[0]}")
    path = entry.get("path", entry.get("local_path"))
    if not isinstance(path, str) or not path.strip():
        raise OpenAIRequestError("lora.path: the adapter's path on the server is required", param="lora.path")
    scale = typed_value("lora.scale", entry.get("scale", 1.0), float)
    if typed_value("lora.int_id", entry.get("int_id", 1), int) < 1:
        raise OpenAIRequestError(f"lora.int_id: expected a positive integer, got {entry.get('int_id')!r}",
                                 param="lora.int_id")
    return confined_lora_name(path), scale


def confined_lora_name(path: str) -> str:
    """The name (relative, ``/``-separated) of the LoRA file or PEFT folder at ``path`` in the LoRA folders.

    ``path`` is absolute or relative to a LoRA folder. Refused (400, naming the request's path and never ours):
    anything whose real location, links resolved, is outside every LoRA folder, and names that do not exist."""
    if "\0" in path:  # os.path would raise on it (a 500); no file has one in its name
        raise OpenAIRequestError(f"lora.path {path!r}: a path cannot hold a NUL character", param="lora.path")
    roots = [os.path.realpath(root) for root in folder_paths.get_folder_paths("loras")]
    candidates = [path] if os.path.isabs(path) else [os.path.join(root, path) for root in roots]
    inside = False
    for candidate in candidates:
        real = os.path.realpath(candidate)
        root = next((r for r in roots if real.startswith(r + os.sep)), None)
        inside = inside or root is not None
        if root is None or not os.path.exists(real):
            continue
        if not (os.path.isfile(real) or os.path.isdir(real)):  # a FIFO, a device: nothing a LoRA can be
            raise OpenAIRequestError(f"lora.path {path!r} is not a file or a folder, so it is no LoRA file or PEFT "
                                     "folder", param="lora.path")
        name = os.path.relpath(real, root).replace(os.sep, "/")
        found = folder_paths.get_full_path("loras", name)
        if found is None or os.path.realpath(found) != real:
            raise OpenAIRequestError(f"lora.path {path!r}: another LoRA folder has a file of the same name, "
                                     "which would be used instead; rename one", param="lora.path")
        return name
    if not inside:
        raise OpenAIRequestError(f"lora.path {path!r} is outside the LoRA folders (models/loras and the server's "
                                 "--allow-lora-dir folders)", param="lora.path", code="lora_path_not_allowed")
    raise OpenAIRequestError(f"lora.path {path!r}: no such LoRA file or PEFT folder", param="lora.path",
                             code="lora_not_found")


def attach_distill(templates: list[Template], files: tuple, models_root: str,
                   input_dir: str) -> list[tuple[Template, list[str], list[str]]]:
    """Chain the ``--lora-path`` files into every template whose model they fit (vllm-omni's distill backend: two
    files on a model with a high- and a low-noise expert go high then low), and make what the files declare
    (steps, shift, cfg) the defaults of the node they chain into, so a request that sends none of those runs.
    Returns each template that got files, with their names and the warnings to print; ValueError (at start) for a
    file that fits no template, lies outside the LoRA folders, or that the template fuses already."""
    names = [_startup_lora_name(path) for path in files]
    ensure_builtin_models({"0": {"inputs": dict(enumerate(names))}}, models_root)
    facts = {name: _file_facts(name) for name in names}
    used, attached = set(), []
    for template in templates:
        ensure_builtin_models(template.prompt, models_root, input_dir)
        model_family = _model_family(template)
        fitting = [name for name in names if facts[name][0] is None or facts[name][0] is model_family]
        if not fitting:
            continue
        warnings = _chain_distill(template, fitting, [facts[name][1] for name in fitting])
        used.update(fitting)
        attached.append((template, fitting, warnings))
    unused = [name for name in names if name not in used]
    if unused:
        raise ValueError(f"--lora-path {unused[0]}: fits none of the served models "
                         f"({', '.join(t.name for t in templates)})")
    return attached


def _startup_lora_name(path: str) -> str:
    try:
        return confined_lora_name(path)
    except OpenAIRequestError as exc:
        raise ValueError(f"--lora-path: {exc.message}".replace("lora.path ", "")) from None


def _file_facts(lora_name: str) -> tuple:
    """(family or None, the contract dict it declares) of a LoRA file. A file whose family cannot be told fits
    every template; the fuse node's key check decides at the first request."""
    path = folder_paths.get_full_path_or_raise("loras", lora_name)
    lora = read_lora(path)
    family = families.guess_family(lora)
    return family, contract_to_dict(discover_contract(path, lora_name, family=family, lora=lora)) or {}


def _model_family(template: Template):
    return families.family_for(_structure(_model_folder(template)))


def _structure(model_dir: str):
    return load_structure(model_dir)


def _model_folder(template: Template) -> str:
    """The diffusers folder behind the distill hook: follow ``model`` links upstream to the loader's
    ``model_name``. ValueError when the template's model is not a diffusers folder we can find."""
    if DISTILL_HOOK not in template.hooks:
        raise ValueError(f"--lora-path: the template of {template.name} ({template.file_name}) declares no "
                         f"'{DISTILL_HOOK}' hook (the model input its distill LoRAs chain into)")
    node_id, input_name = template.hooks[DISTILL_HOOK]
    link = template.prompt[node_id]["inputs"].get(input_name)
    for _ in range(len(template.prompt)):
        if not isinstance(link, list) or link[0] not in template.prompt:
            break
        inputs = template.prompt[link[0]]["inputs"]
        if isinstance(inputs.get("model_name"), str):
            folder = folder_paths.get_full_path("diffusers", inputs["model_name"])
            if folder is not None:
                return folder
            break
        link = inputs.get("model")
    raise ValueError(f"--lora-path: cannot tell which diffusers model the template of {template.name} "
                     f"({template.file_name}) loads (its '{DISTILL_HOOK}' input does not lead to a model_name)")


def _check_pair_order(template: Template, structure, names: list[str]) -> None:
    """A swapped ``--lora-path LOW HIGH`` pair is refused at start (ValueError: the server does not start), by the
    family's own slot check, as the pair node would refuse it at the warm-up (issue 44: the server then ran and
    answered every request 400)."""
    layout = families.family_for(structure).layout
    expert = {role: component for component, role in layout.denoiser_roles(structure).items()}
    try:
        layout.check_slots(structure.model_index, [(expert[ROLE_HIGH_NOISE], names[0], "first --lora-path"),
                                                   (expert[ROLE_LOW_NOISE], names[1], "second --lora-path")])
    except LoraBindError as exc:
        raise ValueError(f"--lora-path {names[0]} {names[1]} for {template.name}: {exc}; give the high-noise "
                         "file first") from None


def _check_not_fused_yet(template: Template, names: list[str]) -> None:
    """Refuse (at start) a file the template already binds: chained again it would be fused twice into the same
    weights (the guide's distill command on a Lightning template fused Lightning twice, silently)."""
    for node_id, node in template.prompt.items():
        for input_name, value in (node.get("inputs") or {}).items():
            if isinstance(value, str) and value in names:
                raise ValueError(f"--lora-path {value}: the template of {template.name} ({template.file_name}) binds "
                                 f"this file already (node {node_id}, {input_name}); fused again it would count "
                                 "twice. Serve a template without it (workflows/base/ holds one per model family) "
                                 "or leave --lora-path out")


def _single_file_warnings(template: Template, structure, names: list[str]) -> list[str]:
    """One file on a model with two experts distills one of them only: said at start, never silently."""
    if len(names) != 1 or not families.has_expert_pair(structure):
        return []
    layout = families.family_for(structure).layout
    try:
        expert = layout.component_for_file(structure.model_index, names[0])
    except LoraBindError:
        return []  # a name that says no expert: the fuse node refuses it at the warm-up, naming it
    return [f"--lora-path {names[0]}: one file for the two experts of {template.name}; it is fused into {expert} "
            "only, and the other expert runs undistilled. Give the high-noise and the low-noise file (high "
            "first) to distill both"]


def _chain_distill(template: Template, names: list[str], contracts: list[dict]) -> list[str]:
    """Chain ``names`` into the template's distill hook; returns the warnings to print at start."""
    _check_not_fused_yet(template, names)
    node_id, input_name = template.hooks[DISTILL_HOOK]
    prompt = template.prompt
    upstream = prompt[node_id]["inputs"][input_name]
    structure = _structure(_model_folder(template))
    warnings = _single_file_warnings(template, structure, names)
    if len(names) == 2 and families.has_expert_pair(structure):
        _check_pair_order(template, structure, names)
        inputs = {"model": upstream, "high_noise_lora": names[0], "high_noise_strength": 1.0,
                  "low_noise_lora": names[1], "low_noise_strength": 1.0}
        upstream = [add_node(prompt, "WanMoELoRAPair", inputs, "--lora-path high/low pair"), 0]
    else:
        for name in names:
            inputs = {"model": upstream, "lora_name": name, "strength": 1.0, "component": "auto"}
            upstream = [add_node(prompt, "FuseDistillLoRA", inputs, f"--lora-path {name}"), 0]
    hook_inputs = prompt[node_id]["inputs"]
    hook_inputs[input_name] = upstream
    for contract in contracts:  # the sampler's steps/shift/cfg as the files declare them
        for key, value in contract.items():
            if key in hook_inputs and isinstance(value, (int, float)) and not isinstance(value, bool):
                hook_inputs[key] = value
    return warnings
