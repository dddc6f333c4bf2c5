"""ComfyUI-``folder_paths``-compatible model registry for the headless runtime.

Nodes reach this module through ``nodes.comfy_bridge.folder_paths()`` when not running inside ComfyUI, so the
names and return shapes follow ComfyUI's module: ``folder_names_and_paths[kind] = ([dirs], {extensions})``,
names relative with ``/``, ``get_full_path_or_raise`` raising ComfyUI's FileNotFoundError text. Differences,
on purpose: only safetensors are listed (the pack refuses pickle formats); ``diffusers`` lists folders holding
``model_index.json`` and ``loras`` also lists PEFT folders (``adapter_config.json``); a name containing ``..``
or an absolute path is refused with an error instead of being silently normalised.
No torch import here: the CLI imports this module on its fast path.
"""

from __future__ import annotations

import os
import time

# the one folder walker and name rules (shared with the nodes inside ComfyUI); re-exported in ComfyUI's shape
from ..usecases.model_folders import (  # noqa: F401
    PEFT_CONFIG,
    SAFETENSORS_EXTENSIONS,
    find_peft_folder,
    lora_names,
    safe_relative_name,
    walk,
)

IMAGE_EXTENSIONS = {".png", ".jpg", ".jpeg", ".webp", ".gif", ".bmp", ".tif", ".tiff"}
FOLDER = "folder"  # ComfyUI's marker extension for kinds whose entries are directories (diffusers)

# kind -> sub-directories of the models root (ComfyUI's defaults for the kinds this pack can use)
_DEFAULT_KINDS = {
    "diffusers": ["diffusers"],
    "loras": ["loras"],
    "checkpoints": ["checkpoints"],
    "diffusion_models": ["unet", "diffusion_models"],
    "text_encoders": ["text_encoders", "clip"],
    "vae": ["vae"],
    "clip_vision": ["clip_vision"],
    "tokenizers": ["tokenizers"],  # lorabind's own: tokenizer folders for text encoders that carry none
}

models_dir = ""
output_directory = ""
input_directory = ""
temp_directory = ""
folder_names_and_paths: dict[str, tuple[list[str], set[str]]] = {}
# name -> real path of files a person named on the command line (`lorabind run --input-file NODE=PATH`): they
# are read where they are, under their own name, instead of being copied into the input folder. Never filled
# by the server: a request cannot name a file outside its folders.
explicit_input_files: dict[str, str] = {}


def configure(models_root: str | None = None, output_dir: str | None = None, input_dir: str | None = None,
              temp_dir: str | None = None) -> None:
    """(Re)root the registry. Defaults: models ``$LORABIND_MODELS`` or ``./models``, output ``./output``,
    input ``./input``, temp ``./temp`` (relative to the current directory, like ComfyUI's base directory)."""
    global models_dir, output_directory, input_directory, temp_directory
    models_dir = os.path.abspath(models_root or os.environ.get("LORABIND_MODELS") or "models")
    output_directory = os.path.abspath(output_dir or "output")
    input_directory = os.path.abspath(input_dir or "input")
    temp_directory = os.path.abspath(temp_dir or "temp")
    folder_names_and_paths.clear()
    explicit_input_files.clear()
    for kind, subdirs in _DEFAULT_KINDS.items():
        extensions = {FOLDER} if kind == "diffusers" else set(SAFETENSORS_EXTENSIONS)
        folder_names_and_paths[kind] = ([os.path.join(models_dir, sub) for sub in subdirs], extensions)


def add_model_folder_path(folder_name: str, full_folder_path: str, is_default: bool = False) -> None:
    """Register another directory for a kind (unknown kinds start with no extension filter)."""
    paths, extensions = folder_names_and_paths.setdefault(folder_name, ([], set()))
    full_folder_path = os.path.abspath(full_folder_path)
    if full_folder_path in paths:
        paths.remove(full_folder_path)
    if is_default:
        paths.insert(0, full_folder_path)
    else:
        paths.append(full_folder_path)


def get_folder_paths(folder_name: str) -> list[str]:
    return list(_kind(folder_name)[0])


def _kind(folder_name: str) -> tuple[list[str], set[str]]:
    if folder_name not in folder_names_and_paths:
        known = ", ".join(sorted(folder_names_and_paths))
        raise KeyError(f"Unknown model folder kind '{folder_name}' (known: {known})")
    return folder_names_and_paths[folder_name]


def get_filename_list(folder_name: str) -> list[str]:
    """Sorted relative names (``/``-separated) of every model of a kind across its directories.

    ``diffusers``: folders containing ``model_index.json``; ``loras``: ``lora_names`` (PEFT folders as themselves).
    Otherwise files with an allowed extension.
    """
    paths, extensions = _kind(folder_name)
    if folder_name == "loras":
        return lora_names(paths)
    names: set[str] = set()
    for prefix, dirs, files in walk(paths):
        if FOLDER in extensions:
            if "model_index.json" in files and prefix:
                names.add(prefix.rstrip("/"))
                dirs[:] = []
            continue
        for file in files:
            if not extensions or os.path.splitext(file)[1].lower() in extensions:
                names.add(prefix + file)
    return sorted(names)


def get_full_path(folder_name: str, filename: str) -> str | None:
    """Absolute path of a listed model (file, or folder for diffusers/PEFT), or None if it does not exist."""
    name = safe_relative_name(folder_name, filename)
    paths, _ = _kind(folder_name)
    for root in paths:
        candidate = os.path.join(root, *name.split("/"))
        if os.path.isfile(candidate) or os.path.isdir(candidate):
            return candidate
    return None


def get_full_path_or_raise(folder_name: str, filename: str) -> str:
    path = get_full_path(folder_name, filename)
    if path is None:
        raise FileNotFoundError(f"Model in folder '{folder_name}' with filename '{filename}' not found.")
    return path


def get_output_directory() -> str:
    return output_directory


def get_input_directory() -> str:
    return input_directory


def get_temp_directory() -> str:
    return temp_directory


def get_directory_by_type(type_name: str) -> str | None:
    """Root of a ``{"type": "output"|"input"|"temp"}`` UI file entry, or None for an unknown type."""
    return {"output": output_directory, "input": input_directory, "temp": temp_directory}.get(type_name)


# ComfyUI's "name [output]" annotation: which folder a LoadImage value refers to (default: the input folder).
_ANNOTATIONS = {" [output]": "output", " [input]": "input", " [temp]": "temp"}


def get_annotated_filepath(name: str, default_dir: str | None = None) -> str:
    """The path of a file value such as ``"lorabind-tiny/start.png"`` or ``"x.png [output]"``, ComfyUI's way.

    Unlike ComfyUI, a name that would leave its folder (absolute, ``..``, a symlink pointing out) raises
    ``ValueError`` instead of resolving anywhere on disk; only a file given by path on the command line
    (``explicit_input_files``) is read outside the input folder.
    """
    if default_dir is None and name in explicit_input_files:
        return explicit_input_files[name]
    base_dir = default_dir or input_directory
    for suffix, kind in _ANNOTATIONS.items():
        if name.endswith(suffix):
            name, base_dir = name[: -len(suffix)], get_directory_by_type(kind)
            break
    relative = safe_relative_name("input", name)
    root = os.path.realpath(base_dir)
    path = os.path.realpath(os.path.join(root, *relative.split("/")))
    if os.path.commonpath((root, path)) != root:
        raise ValueError(f"Refusing file name '{name}': it resolves outside '{base_dir}'.")
    return path


def exists_annotated_filepath(name: str) -> bool:
    try:
        return os.path.isfile(get_annotated_filepath(name))
    except ValueError:
        return False


# The built-in examples' input images live in this subfolder (tiny_models.input_images.INPUT_FOLDER; a test keeps
# the two equal: this module stays torch-free, so it cannot import the tiny-model package).
EXAMPLE_INPUT_FOLDER = "lorabind-tiny"


def get_input_image_list() -> list[str]:
    """Image files directly in the input folder, then the examples' images (``lorabind-tiny/start.png``), sorted.

    ComfyUI's LoadImage lists no subfolders but accepts ``subfolder/name`` values. The examples' own folder is
    listed too because the frontend (1.58.1, missingMediaScan) marks a LoadImage whose value is not among the
    choices as "Media input missing", with a red node: every image-to-video template opened that way (issue 30).
    """
    listed = _images_in(input_directory, "")
    listed += _images_in(os.path.join(input_directory, EXAMPLE_INPUT_FOLDER), EXAMPLE_INPUT_FOLDER + "/")
    return listed


def _images_in(folder: str, prefix: str) -> list[str]:
    if not os.path.isdir(folder):
        return []
    return sorted(prefix + name for name in os.listdir(folder)
                  if os.path.isfile(os.path.join(folder, name))
                  and os.path.splitext(name)[1].lower() in IMAGE_EXTENSIONS)


def _expand_prefix_variables(prefix: str, width: int, height: int) -> str:
    now = time.localtime()
    replacements = {
        "%width%": str(width), "%height%": str(height), "%year%": str(now.tm_year),
        "%month%": f"{now.tm_mon:02d}", "%day%": f"{now.tm_mday:02d}", "%hour%": f"{now.tm_hour:02d}",
        "%minute%": f"{now.tm_min:02d}", "%second%": f"{now.tm_sec:02d}",
    }
    for variable, value in replacements.items():
        prefix = prefix.replace(variable, value)
    return prefix


def get_save_image_path(filename_prefix: str, output_dir: str, image_width: int = 0, image_height: int = 0
                        ) -> tuple[str, str, int, str, str]:
    """(full_output_folder, filename, counter, subfolder, filename_prefix) like ComfyUI: the next free
    ``<filename>_<counter:05>_`` number in the folder; the prefix may hold a subfolder and %width%-style
    variables but may not leave ``output_dir``."""
    if "%" in filename_prefix:
        filename_prefix = _expand_prefix_variables(filename_prefix, image_width, image_height)
    normalized = os.path.normpath(filename_prefix)
    subfolder, filename = os.path.dirname(normalized), os.path.basename(normalized)
    output_dir = os.path.abspath(output_dir)
    full_output_folder = os.path.abspath(os.path.join(output_dir, subfolder))
    if os.path.commonpath((output_dir, full_output_folder)) != output_dir:
        raise ValueError(
            f"Saving outside the output folder is not allowed: prefix '{filename_prefix}' resolves to "
            f"'{full_output_folder}', outside '{output_dir}'."
        )
    os.makedirs(full_output_folder, exist_ok=True)
    counter = 1
    stem = os.path.normcase(filename) + "_"
    for existing in os.listdir(full_output_folder):
        if not os.path.normcase(existing).startswith(stem):
            continue
        digits = existing[len(stem):].split("_")[0]
        if digits.isdigit():
            counter = max(counter, int(digits) + 1)
    return full_output_folder, filename, counter, subfolder, filename_prefix


configure()
