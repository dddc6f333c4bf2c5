"""Built-in tiny models: offline, deterministic diffusers folders built from configs with random weights.

They are the default models of every example workflow and test, so a fresh machine runs the README's main
command with no download: ``lorabind run`` calls ``ensure_builtin_models`` and the model loader node calls
``build_builtin`` for a missing one; each folder is built in about a second under ``<models_root>/diffusers/``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Iterable, Optional

from ..loaders.families import tiny_recipes
from ..loaders.models import compat
from . import lora_fixtures, minimax_h3, qwen_image, qwen_image_edit, single_files, wan, wan_i2v, wan_vace
from ._common import diffusers_dir, log, stale_reason
from .input_images import ensure_input_images, write_input_images

# Which built-ins exist, and which library versions each needs, is each family's list (``FamilyLayout.tiny_models``);
# the builder of each name is here, imported as code (one builder may write several folders: MiniMax-H3's plain
# and pinned models).
RECIPES = tiny_recipes()
BUILDERS: dict[str, Callable] = {
    "tiny-wan22-t2v": wan.build_tiny_wan22, "tiny-wan21-t2v": wan.build_tiny_wan21,
    "tiny-wan22-i2v": wan_i2v.build_tiny_wan22_i2v, "tiny-wan21-i2v": wan_i2v.build_tiny_wan21_i2v,
    "tiny-wan22-ti2v": wan_i2v.build_tiny_wan22_ti2v, "tiny-wan21-vace": wan_vace.build_tiny_wan21_vace,
    "tiny-wan22-vace-fun": wan_vace.build_tiny_wan22_vace_fun, "tiny-qwen-image": qwen_image.build_tiny_qwen_image,
    "tiny-qwen-image-edit": qwen_image_edit.build_tiny_qwen_image_edit,
    "tiny-qwen-image-edit-plus": qwen_image_edit.build_tiny_qwen_image_edit_plus,
    "tiny-minimax-h3": minimax_h3.build_tiny_minimax_h3, "tiny-minimax-h3-pinned": minimax_h3.build_tiny_minimax_h3,
}
_UNBUILT = sorted(set(RECIPES) - set(BUILDERS))
if _UNBUILT:
    raise ImportError(f"the families list built-in tiny models the factory has no builder for: {_UNBUILT}")
BUILTIN_NAMES = tuple(RECIPES)
BUILTIN_FAMILIES = {name: recipe.requirements_id for name, recipe in RECIPES.items()}
# builders that write several folders at once are run by name set, not one folder at a time
_SHARED_BUILDERS = {b for b in BUILDERS.values() if list(BUILDERS.values()).count(b) > 1}
# name -> builder(models_root) -> folder written, for the built-ins built one folder at a time
BUILTIN_MODELS: dict[str, Callable[[Path], Path]] = {
    name: BUILDERS[name] for name in RECIPES if BUILDERS[name] not in _SHARED_BUILDERS}


def fixture_lora_names() -> tuple:
    """Every fixture LoRA's name (``lorabind-tiny/<published name>``): each carries a distill LoRA's published name."""
    return tuple(lora_fixtures.FIXTURE_NAMES) + tuple(minimax_h3.FIXTURE_NAMES)


def unavailable_builtins() -> dict[str, str]:
    """{name: why} for built-ins whose family needs newer libraries than the installed ones."""
    unmet = {name: compat.unmet_requirements(family) for name, family in BUILTIN_FAMILIES.items()}
    return {name: "needs " + " and ".join(reqs) for name, reqs in unmet.items() if reqs}


def build_builtin(name: str, models_root) -> Path:
    """Build one built-in model (MiniMax-H3: its whole set) and return its folder."""
    models_root = Path(models_root)
    recipe = RECIPES.get(name)
    if recipe is None:
        raise KeyError(f"unknown built-in model {name!r}; known: {sorted(BUILTIN_NAMES)}")
    compat.require(recipe.requirements_id, f"the built-in {name}")
    BUILDERS[name](models_root)
    return diffusers_dir(models_root) / name


def _build_recipes(names: Iterable[str], models_root: Path, force: bool = False) -> list[Path]:
    """Run each named recipe's builder once (a shared builder writes all its folders) unless every folder it
    writes is current (``needs_build``) and ``force`` is off; the folders written."""
    written: list[Path] = []
    done = set()
    for name in dict.fromkeys(names):
        builder = BUILDERS[name]
        if builder in done:
            continue
        done.add(builder)
        folders = [other for other, b in BUILDERS.items() if b is builder]
        if not force and not any(needs_build(diffusers_dir(models_root) / folder) for folder in folders):
            continue
        compat.require(RECIPES[name].requirements_id, f"the built-in {name}")
        result = builder(models_root)
        written += [Path(p) for p in result] if isinstance(result, (list, tuple)) else [Path(result)]
    return written


def build_tiny(models_root, names: Optional[Iterable[str]] = None, input_dir=None, force: bool = False) -> list[Path]:
    """Build the built-in models that are missing or stale and return every path written; ``force`` rebuilds
    what is current too. Why skip: everything is deterministic, so a current folder would be rewritten with the
    same bytes, and ``lorabind models build-tiny`` on a set-up machine took a minute to change nothing.

    ``names=None`` builds every model the installed libraries support (``unavailable_builtins`` names what is
    skipped and why): the models above, the MiniMax-H3 models, the fixture LoRAs (files with the real
    published names under ``loras/lorabind-tiny/``, synthetic weights sized for the tiny models), the tiny
    single files in ComfyUI's folders (``single_files``) and, with ``input_dir``, the example start/end images
    under ``<input_dir>/lorabind-tiny/``. The LoRAs and single files are written again when a model they are
    made from was rebuilt or one of them is missing.
    With ``names``, only those models (unknown names raise ``KeyError`` listing the known ones; a model whose
    family needs newer libraries raises ``ModelLoadError`` naming the versions).
    """
    models_root = Path(models_root)
    if names is None:
        skipped = unavailable_builtins()
        written = _build_recipes([name for name in BUILTIN_NAMES if name not in skipped], models_root, force)
        rebuilt = force or bool(written)
        # written even when the MiniMax-H3 models cannot be built here (they need only torch): the examples
        # then pass validation and the model loader refuses them naming the diffusers version needed, instead
        # of ComfyUI answering "Value not in list" for the LoRA
        for names_of, write in ((minimax_h3.FIXTURE_NAMES, minimax_h3.write_minimax_fixture_loras),
                                (lora_fixtures.FIXTURE_NAMES, lora_fixtures.write_fixture_loras)):
            if rebuilt or _any_missing(models_root / "loras", names_of):
                written += [Path(p) for p in write(models_root)]
        singles = single_files.tiny_file_names()
        if rebuilt or any(_any_missing(models_root / kind, names_of) for kind, names_of in singles.items()):
            written += single_files.write_tiny_single_files(models_root)
        if input_dir is not None:
            written += write_input_images(input_dir)
        return written
    unknown = sorted(set(names) - set(BUILTIN_NAMES))
    if unknown:
        raise KeyError(f"unknown built-in model(s) {unknown}; known: {sorted(BUILTIN_NAMES)}")
    return _build_recipes(names, models_root, force)


def _any_missing(folder: Path, names) -> bool:
    return any(not (folder / name).exists() for name in names)


def _strings_in(value) -> Iterable[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _strings_in(item)
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _strings_in(item)


def needs_build(folder: Path) -> bool:
    """A built-in folder that is missing, or was built by other library versions (its random weights, and so its
    outputs, would differ from a fresh build's): the latter is rebuilt, and said so."""
    if not (folder / "model_index.json").exists():
        return True
    reason = stale_reason(folder)
    if reason:
        log.warning("rebuilding the built-in tiny model %s: %s", folder.name, reason)
    return reason is not None


def ensure_builtin_models(prompt: dict, models_root, input_dir=None,
                          announce: Optional[Callable[[str], None]] = None) -> list[str]:
    """Build each built-in model that an API prompt names (in any string input) and that is missing; with
    ``input_dir``, also the example input images it names (``lorabind-tiny/start.png``...).

    Returns the names built. A folder counts as present when its ``model_index.json`` exists. ``announce``
    gets one line saying what is about to be built (only when something is): building writes into the models
    root and takes a while, so a person should know why.
    """
    named = set()
    for node in prompt.values():
        if isinstance(node, dict):
            named.update(s.strip().replace("\\", "/").rstrip("/") for s in _strings_in(node.get("inputs", {})))
    root = diffusers_dir(models_root)
    loras = _missing_fixtures(named, models_root)
    sources = {lora_fixtures.FIXTURE_SOURCES[name] for name in loras if name in lora_fixtures.FIXTURE_SOURCES}
    models = [name for name in BUILTIN_NAMES if (name in named or name in sources) and needs_build(root / name)]
    if announce is not None and (models or loras):
        what = [f"tiny model{'s' if len(models) > 1 else ''} {', '.join(models)}"] if models else []
        what += [f"{len(loras)} fixture LoRA{'s' if len(loras) > 1 else ''}"] if loras else []
        announce(f"building the built-in {' and '.join(what)} under {models_root} (first use; offline, random "
                 f"weights)")
    for name in models:
        build_builtin(name, models_root)
    # the single files first: the tiny folders they are made from give the fixture LoRAs their shapes (a
    # single-file example with a fixture pair names no tiny folder)
    built = models + single_files.ensure_tiny_single_files(named, models_root)
    built += ensure_fixture_loras(named, models_root)
    if input_dir is not None:
        built += ensure_input_images(named, input_dir)
    return built


def _missing_fixtures(named, models_root) -> list[str]:
    lora_dir = Path(models_root) / "loras"
    return [name for names in (lora_fixtures.FIXTURE_NAMES, minimax_h3.FIXTURE_NAMES) for name in names
            if name in named and not (lora_dir / name).exists()]


def ensure_fixture_loras(named, models_root) -> list[str]:
    """Write the fixture LoRA sets a prompt names (``named``: its string values) when a file is missing.

    Only names inside the fixture folder count (``lorabind-tiny/<published name>``): a published name anywhere
    else is the user's own download, so a missing one is never created here; the prompt then fails validation
    with the list of choices like any missing file. Call it after the named tiny models are built: the Wan/Qwen
    fixtures take their shapes from them. Returns the fixture names that were missing and are now written.
    """
    lora_dir = Path(models_root) / "loras"
    written = []
    for names, write in ((lora_fixtures.FIXTURE_NAMES, lora_fixtures.write_fixture_loras),
                         (minimax_h3.FIXTURE_NAMES, minimax_h3.write_minimax_fixture_loras)):
        missing = [name for name in names if name in named and not (lora_dir / name).exists()]
        if missing:
            write(models_root)
            written += [name for name in missing if (lora_dir / name).exists()]
    return written
