"""``check_prompt_files``: every model file a prompt names, found, broken or missing, with the folders searched.

Why: a real-size workflow names files a new user has to download and place (a diffusers folder, ComfyUI's single
files, LoRAs); a missing one used to surface as "Value not in list" without saying where it was looked for.
``lorabind models check`` prints this report, and the executor's "not in list" error names the same folders
(``searched_text``). The table below says which folder kind an input names; it is keyed by input name because
every loader node uses ComfyUI's input names for the same kinds of file.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Optional

from ..loaders.dispatch.contract_discovery import lora_file_contracts
from ..loaders.errors import LoraBindError
from ..loaders.families import detect_model_family
from ..loaders.io.model_index import read_model_index
from ..loaders.models.single_file.detect import detect
from .file_sources import source_of
from .models import builtin_file_names, builtin_model_names
from .repository_models import describe as describe_repository_files
from .repository_models import is_repository_id, repository_files

# input name -> the model folder kind its file lives in (ComfyUI's folder names)
FILE_INPUTS = {
    "model_name": "diffusers",
    "denoiser": "diffusion_models",
    "denoiser_low_noise": "diffusion_models",
    "vae": "vae",
    "text_encoder": "text_encoders",
    "clip_vision": "clip_vision",
    "lora_name": "loras",
    "high_noise_lora": "loras",
    "low_noise_lora": "loras",
}
NO_FILE_VALUES = frozenset({"", "none"})


@dataclass(frozen=True)
class FileCheck:
    node_id: str
    input_name: str
    kind: str  # the folder kind (FILE_INPUTS)
    name: str  # as the prompt names it, relative to its folder
    found: bool
    searched: tuple  # the folders of that kind, in search order
    what: str = ""  # for a found file: family, variant, dtype, expert (or, when broken, why it cannot be read)
    broken: bool = False  # present, but its header says it is empty, truncated or not a file of its kind
    elsewhere: tuple = ()  # for a missing file: the other folder kinds holding a file of that name

    def line(self) -> str:
        where = f"node {self.node_id} {self.input_name}: {self.kind}/{self.name}"
        if self.broken:
            return f"BROKEN   {where} — {self.what}"
        if self.found:
            return f"found    {where}" + (f" — {self.what}" if self.what else "")
        why = f"{self.what}; " if self.what else ""
        searched = ", ".join(self.searched) or f"(no {self.kind} folder configured)"
        elsewhere = "".join(f"found in {kind}/, move it to {self.kind}/; " for kind in self.elsewhere)
        return f"MISSING  {where} — {why}{elsewhere}searched {searched}; source: {source_of(self.kind, self.name)}"


def check_prompt_files(prompt: dict, registry) -> list[FileCheck]:
    """One ``FileCheck`` per file-naming input of ``prompt`` (API format), in node order."""
    checks = []
    for node_id, node in prompt.items():
        for input_name, value in (node.get("inputs") or {}).items():
            kind = FILE_INPUTS.get(input_name)
            if kind is None or not isinstance(value, str) or value in NO_FILE_VALUES:
                continue
            checks.append(_check(registry, node_id, input_name, kind, value))
    return checks


def folders_of(registry, kind: str) -> tuple:
    try:
        return tuple(registry.get_folder_paths(kind))
    except KeyError:
        return ()


def searched_text(registry, kind: str, models_root: Optional[str] = None) -> str:
    """"searched models/diffusion_models, models/unet": the folders of ``kind``, relative to ``models_root`` when
    given (a message the browser sees must not carry local absolute paths; one outside it is counted only)."""
    folders = folders_of(registry, kind)
    if models_root is None:
        return "searched " + (", ".join(folders) or f"(no {kind} folder configured)")
    root = os.path.abspath(models_root)
    inside = ["models/" + os.path.relpath(f, root).replace(os.sep, "/") for f in folders
              if os.path.abspath(f).startswith(root + os.sep)]
    outside = len(folders) - len(inside)
    return "searched " + ", ".join(inside + ([f"{outside} other {kind} folder(s)"] if outside else []))


def _check(registry, node_id: str, input_name: str, kind: str, name: str) -> FileCheck:
    searched = folders_of(registry, kind)
    try:
        path = registry.get_full_path(kind, name) if searched else None
    except ValueError as exc:  # an absolute or ``..`` name
        return FileCheck(node_id, input_name, kind, name, False, searched, str(exc))
    if path is None and _is_builtin(kind, name):
        return FileCheck(node_id, input_name, kind, name, True, searched,
                         "built-in tiny model, built on first use")
    if path is None and kind == "diffusers" and is_repository_id(name):  # a repository id: its single files
        files = repository_files(registry, name)
        return FileCheck(node_id, input_name, kind, name, files is not None, searched,
                         describe_repository_files(files) if files else
                         "a repository id: its published single files are not in the model folders")
    if path is None:
        return FileCheck(node_id, input_name, kind, name, False, searched, elsewhere=_elsewhere(registry, kind, name))
    try:
        what = _describe(kind, path, name)
    except (LoraBindError, OSError, ValueError, KeyError) as exc:  # a 0-byte or cut-off download, another kind
        return FileCheck(node_id, input_name, kind, name, True, searched, f"not readable as a {kind} file: {exc}",
                         broken=True)
    return FileCheck(node_id, input_name, kind, name, True, searched, what)


def _elsewhere(registry, kind: str, name: str) -> tuple:
    """The other folder kinds (``checkpoints``, ``loras``...) holding a file of this name: a file put in the wrong
    folder is the commonest "missing" file."""
    kinds = getattr(registry, "folder_names_and_paths", None) or {}
    found = []
    for other in kinds:
        try:
            if other != kind and registry.get_full_path(other, name) is not None:
                found.append(other)
        except (ValueError, KeyError):
            continue
    return tuple(found)


def _is_builtin(kind: str, name: str) -> bool:
    return name in builtin_model_names() if kind == "diffusers" else name in builtin_file_names(kind)


def _describe(kind: str, path: str, name: str) -> str:
    """What the file is, read from its header / model_index.json / name (nothing loaded); the reader's error for
    a file that is not one: its header checked against the file's size, bounded as ``inspect`` reads it."""
    if kind == "diffusers":
        return f"diffusers folder, {detect_model_family(read_model_index(path))}"
    if kind == "loras":
        _, family, contracts = lora_file_contracts(path, name)
        family_id = family.id if family is not None else "unknown family"
        return f"LoRA, {family_id}" + (f", {contracts[0].describe()}" if contracts else "")
    return detect(path, name).describe().split(": ", 1)[-1]
