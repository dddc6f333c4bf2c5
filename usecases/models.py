"""Finding, resolving and loading models for a host: the model list, a name to a folder, a folder to a handle.

Why here: the loader nodes, ``lorabind run`` (validation lists every node's choices) and the server's
``/object_info`` all list the same models; the list walks the users' folders with the one guarded walker
(``model_folders.walk``) and adds the built-in tiny models, which are built on first use. A host passes its
registry (ComfyUI's ``folder_paths`` or the runtime's), so nothing here knows which host runs.
"""

from __future__ import annotations

import functools
import hashlib
import os
from pathlib import Path
from stat import S_ISREG
from typing import Optional

from ..loaders.binding.bind import set_adapter_cache_size
from ..loaders.families import checkpoint_contracts
from ..loaders.handles import ModelHandle
from ..loaders.io.file_identity import model_folder_identity
from ..loaders.models.single_file.pipelines import detect_set, load_single_files
from ..loaders.models.store import load_model as load_folder
from . import host
from .model_folders import MODEL_INDEX, files_named, model_folder_names, safe_relative_name
from .repository_models import present_repositories, repository_files

MODEL_FOLDER_KIND = "diffusers"
TOKENIZER_KIND = "tokenizers"  # models/tokenizers/ and ``lorabind run --tokenizer DIR``
DENOISER_KIND = "diffusion_models"  # ComfyUI's folder of single-file denoisers (also ``unet``)
GGUF_EXTENSION = ".gguf"


def builtin_model_names() -> tuple:
    """The built-in tiny models the host offers (built on first use), () when it offers none."""
    factory = host.builtin_models()
    return tuple(factory.BUILTIN_NAMES) if factory is not None else ()


def builtin_file_names(kind: str) -> list[str]:
    """The built-in tiny single files of a ComfyUI folder kind (``diffusion_models``, ``vae``...)."""
    factory = host.builtin_models()
    return list(factory.single_files.tiny_file_names().get(kind, ())) if factory is not None else []


def gguf_denoiser_names(registry) -> list[str]:
    """The ``.gguf`` denoisers under the ``diffusion_models`` roots (relative names), which the checkpoint loader
    reads beside the safetensors files."""
    try:
        roots = registry.get_folder_paths(DENOISER_KIND)
    except KeyError:
        return []
    return files_named(roots, GGUF_EXTENSION)


def ensure_builtin_files(names, models_root) -> list[str]:
    """Build the named built-in single files under ``models_root`` when missing; the names written."""
    factory = host.builtin_models()
    return factory.single_files.ensure_tiny_single_files(names, models_root) if factory is not None else []


def ensure_builtins_for_prompt(prompt: dict, models_root, input_dir, announce) -> list[str]:
    """Build the built-in tiny models, fixture LoRAs and example input images an API ``prompt`` names and that are
    missing (the host's factory's ``ensure_builtin_models``: what ``lorabind run`` does first); the names built."""
    factory = host.builtin_models()
    return factory.ensure_builtin_models(prompt, models_root, input_dir, announce=announce) if factory else []


def diffusers_roots(registry) -> list[Path]:
    return [Path(p) for p in registry.get_folder_paths(MODEL_FOLDER_KIND)]


def list_models(registry) -> list[str]:
    """Every folder with a ``model_index.json`` under the ``diffusers`` roots (relative, ``/``-separated), plus
    the built-in tiny models, which the loader builds on first use (so a fresh install works offline), plus the
    repository ids whose published single files are there (``usecases.repository_models``). The roots
    stay strings (as here and in ``find_model``): this runs for every prompt's validation, where making Path
    objects of them cost more than the remembered listing."""
    folders = model_folder_names(registry.get_folder_paths(MODEL_FOLDER_KIND))
    return sorted(set(builtin_model_names()) | set(folders) | set(present_repositories(registry)))


def find_model(registry, model_name: str) -> Optional[Path]:
    """The existing folder a model name names, confined to the ``diffusers`` roots (None when absent)."""
    found = _model_index(registry, model_name)
    return Path(found[0]) if found is not None else None


def model_version(registry, model_name: str) -> Optional[str]:
    """A short digest of every file of the folder ``find_model`` finds and of its component folders
    (``file_identity.model_folder_identity``: what the model store keys the loaded model by), None when absent.
    The loader's IS_CHANGED asks it for every prompt, so a rebuilt folder, a replaced VAE or a weight rewritten in
    place with its size reloads the model on the next prompt (issues 54 and 61). A few dozen ``stat`` calls for a
    real folder; a digest, because the value is embedded in outputs and must not carry paths."""
    found = _model_index(registry, model_name)
    if found is None:
        return None
    try:
        identity = model_folder_identity(found[0])
    except OSError:
        return None
    return hashlib.sha256(repr(identity).encode()).hexdigest()[:16]


def _model_index(registry, model_name: str) -> Optional[tuple]:
    """``(folder, os.stat of its model_index.json)`` of the first root holding the model as a regular file."""
    for folder in _candidate_folders(registry, model_name):
        try:
            found = os.stat(os.path.join(folder, MODEL_INDEX))
        except OSError:
            continue
        if S_ISREG(found.st_mode):
            return folder, found
    return None


def _candidate_folders(registry, model_name: str) -> list[str]:
    """Where a model name may be, root by root; a name that would leave the roots is refused by name."""
    parts = _confined_parts(model_name)
    return [os.path.join(root, *parts) for root in registry.get_folder_paths(MODEL_FOLDER_KIND)]


@functools.lru_cache(maxsize=256)
def _confined_parts(model_name: str) -> tuple:
    """The path parts of a model name that stays under a root (``safe_relative_name``'s rule; the error names the
    loader's input). Remembered per name (a pure function of the string): the loader's IS_CHANGED asks for every
    prompt, and parsing the name each time was a tenth of a seed-only rerun's IS_CHANGED work."""
    try:
        relative = safe_relative_name(MODEL_FOLDER_KIND, model_name)
    except ValueError:
        relative = ""
    if not relative:  # refused, or "." / "./": the root itself, which is no model folder
        raise ValueError(f"model_name {model_name!r}: must be a folder name under models/{MODEL_FOLDER_KIND}")
    return tuple(relative.split("/"))


def resolve_model(registry, model_name: str) -> Path:
    """``find_model``, building a missing (or stale, see ``needs_build``) built-in tiny model first; otherwise a
    missing folder raises."""
    folder = find_model(registry, model_name)
    factory = host.builtin_models() if model_name in builtin_model_names() else None
    if folder is not None and not (factory is not None and factory.needs_build(folder)):
        return folder
    roots = diffusers_roots(registry)
    default_root = next((r for r in roots if r.name == MODEL_FOLDER_KIND), None)
    if factory is not None and default_root is not None:
        return factory.build_builtin(model_name, default_root.parent)  # builders write <models root>/diffusers/<name>
    # named as the models folder names it, not by absolute path: the message reaches the browser
    raise FileNotFoundError(f"model_name {model_name!r}: no {model_name}/model_index.json in the "
                            f"{MODEL_FOLDER_KIND} model folder{'s' if len(roots) > 1 else ''}")


def load_model(folder: Path, *, name: str, max_cached_adapters: int = 0, **options) -> ModelHandle:
    """The shared model of a folder as a handle carrying the contracts its checkpoint pins; ``options`` are
    ``model_store.load_model``'s (dtype, device, memory, attention, compile, progress, device-memory hook)."""
    model = load_folder(folder, name=name, **options)
    if max_cached_adapters:
        set_adapter_cache_size(model, max_cached_adapters)
    return ModelHandle(model, contracts=checkpoint_contracts(model))


def load_repository_model(registry, model_name: str, **options) -> Optional[ModelHandle]:
    """The handle of a repository id's published single files under the models folders
    (``repository_models.repository_files``), None when ``model_name`` is not one or they are not all there;
    ``options`` are ``load_single_files``'s."""
    files = repository_files(registry, model_name)
    if files is None:
        return None
    named = {kind: [(str(path), name) for name, path in entries] for kind, entries in files.items()}
    handle, _ = load_checkpoint_files(named["diffusion_models"], named["vae"][0], named["text_encoders"][0],
                                      tokenizer_dirs=tokenizer_dirs(registry), **options)
    return handle


def repository_files_stat(registry, model_name: str) -> Optional[tuple]:
    """(size, mtime_ns) of each of a repository id's files found (None when it is not one or they are not all
    there): what the loader's IS_CHANGED compares."""
    files = repository_files(registry, model_name)
    if files is None:
        return None
    return tuple((os.stat(path).st_size, os.stat(path).st_mtime_ns) for entries in files.values()
                 for _, path in entries)


def load_checkpoint_files(denoisers: list, vae: tuple, text_encoder: tuple, image_encoder=None, **options):
    """(handle, what was detected) for ComfyUI's single files, ``(path, name)`` each; ``options`` are
    ``load_single_files``'s."""
    files = detect_set(denoisers, vae, text_encoder, image_encoder)
    model = load_single_files(files, **options)
    return ModelHandle(model, contracts=checkpoint_contracts(model)), files.describe()


def tokenizer_dirs(registry) -> list[Path]:
    """Folders that may hold a Qwen2.5-VL tokenizer: ``--tokenizer`` and ``models/tokenizers/`` (and their
    subfolders), then diffusers folders' ``tokenizer/`` (the tiny built-ins last). ComfyUI's own copy is added
    by the loader."""
    found = []
    for kind in (TOKENIZER_KIND, MODEL_FOLDER_KIND):
        try:
            roots = [Path(p) for p in registry.get_folder_paths(kind)]
        except KeyError:
            continue
        if kind == TOKENIZER_KIND:
            found += [p for root in roots for p in [root, *sorted(root.glob("*/"))] if p.is_dir()]
            continue
        for root in roots:
            folders = sorted(root.glob("*/tokenizer"), key=lambda p: (p.parent.name.startswith("tiny-"), str(p)))
            found += [p for p in folders if (p.parent / "model_index.json").is_file()]
    return found
