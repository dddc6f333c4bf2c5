"""The one place where the pack touches ComfyUI modules — lazily and optionally.

Inside ComfyUI we use its ``folder_paths``, ``comfy.utils.ProgressBar``, its interrupt check and its
``model_management`` (the default device; freeing its models before ours take VRAM; releasing ours when it
unloads); headless we use the runtime's equivalents, which the runtime installs in ``usecases.host`` (the nodes
never import the runtime: it imports them), and the session defaults of ``loaders.placement.devices``. Every node goes
through these functions so that no node module imports ComfyUI at import time.
"""

from __future__ import annotations

import importlib
import os
from functools import lru_cache

from ..usecases import host
from ..usecases.model_folders import PEFT_CONFIG, find_peft_folder, folders_holding, safe_relative_name
from ..usecases.model_folders import lora_names as list_loras
from ..usecases.verbs import (
    ensure_builtins_for_prompt,
    follow_host_node_cache,
    preview_map,
    release_device_memory,
    step_previewer,
)
from ..usecases.vocabulary import LoraBindError


@lru_cache(maxsize=1)
def _comfy_modules():
    """Return (folder_paths, comfy.utils, comfy.model_management) when running inside ComfyUI, else None."""
    try:
        folder_paths = importlib.import_module("folder_paths")
        comfy_utils = importlib.import_module("comfy.utils")
        model_management = importlib.import_module("comfy.model_management")
    except Exception:  # not inside ComfyUI (or a broken install): use the runtime's equivalents
        return None
    return folder_paths, comfy_utils, model_management


def folder_paths():
    """ComfyUI's ``folder_paths`` module, or the runtime's compatible registry."""
    mods = _comfy_modules()
    if mods is not None:
        return mods[0]
    return host.folder_paths()


def lora_names() -> list[str]:
    """LoRA files and PEFT adapter folders under the loras folders: one rule inside ComfyUI and headless
    (``usecases.model_folders.lora_names``), so a prompt valid in one is valid in the other; ComfyUI's own list
    would add each PEFT folder's inner weight file and pickle files. Names that link out of the loras folders
    are left out, as ``lora_full_path`` refuses them."""
    names = list_loras(folder_paths().get_folder_paths("loras"))
    roots = _real_lora_roots()
    return [name for name in names if _stays_inside(_listed_lora_path(name), roots)]


def peft_folder_names() -> list[str]:
    """The PEFT adapter folders among ``lora_names`` (the PEFT adapter node lists only those)."""
    folders = set(folders_holding(folder_paths().get_folder_paths("loras"), PEFT_CONFIG))
    return [name for name in lora_names() if name in folders]


def lora_full_path(name: str) -> str | None:
    """Absolute path of a name from ``lora_names`` (ComfyUI's ``get_full_path`` finds files only); None when there
    is none, or when the file, the folder or a file in it is a symlink to a place outside every loras folder:
    a LoRA name must not reach other files, as no model name may (linking a whole loras folder from another disk
    is fine: each folder counts by its real path)."""
    path = _listed_lora_path(name)
    return path if _stays_inside(path, _real_lora_roots()) else None


def model_file_path(kind: str, name: str) -> str | None:
    """Absolute path of a single model file ``name`` in ComfyUI's ``kind`` folders (``diffusion_models`` also finds
    ``unet``), confined as ``lora_full_path`` confines LoRA names: None when there is none or when it links out
    of every folder of that kind."""
    paths = folder_paths()
    path = paths.get_full_path(kind, name)
    roots = [os.path.realpath(root) for root in paths.get_folder_paths(kind)]
    return path if path is not None and os.path.isfile(path) and _stays_inside(path, roots) else None


def _listed_lora_path(name: str) -> str | None:
    paths = folder_paths()
    path = paths.get_full_path("loras", name)
    if path is None and _comfy_modules() is not None:
        path = find_peft_folder(paths.get_folder_paths("loras"), name)
    return path


def _real_lora_roots() -> list[str]:
    return [os.path.realpath(root) for root in folder_paths().get_folder_paths("loras")]


def _stays_inside(path: str | None, roots: list[str]) -> bool:
    """Whether ``path`` (and, for a PEFT folder, each entry in it) resolves inside one of ``roots``."""
    if path is None:
        return False
    entries = [os.path.join(path, entry) for entry in os.listdir(path)] if os.path.isdir(path) else []
    for candidate in (path, *entries):
        real = os.path.realpath(candidate)
        if not any(real == root or real.startswith(root.rstrip(os.sep) + os.sep) for root in roots):
            return False
    return True


def checked_model_name(kind: str, name: str) -> str:
    """``name`` normalised, or ValueError naming it when it is absolute or leaves the ``kind`` folder (``..``).
    The runtime's rule, applied inside ComfyUI too: ComfyUI's ``get_full_path`` silently re-roots such names,
    and a request that asks for ``../../etc/passwd`` should hear that it was refused, not get another file."""
    return safe_relative_name(kind, name)


def add_server_routes(routes) -> bool:
    """Inside ComfyUI: add the pack's ``(method, path, handler)`` routes to ``PromptServer.instance.routes``
    (ComfyUI also serves each under ``/api``). Imported only now, so the pack still loads headless and in a
    ComfyUI without a server instance; a route already there (the pack imported twice) is not added again,
    since aiohttp refuses a second handler for one method and path. False when there is no ComfyUI server."""
    try:
        table = importlib.import_module("server").PromptServer.instance.routes
    except Exception:  # headless, or a ComfyUI whose server is not running: nothing to register with
        return False
    present = {(getattr(route, "method", None), getattr(route, "path", None)) for route in table}
    for method, path, handler in routes:
        if (method, path) not in present:
            table.route(method, path)(handler)
    return True


_PROMPT_HANDLER_MARK = "_lorabind_builds_what_prompts_name"


def build_builtins_on_prompt() -> bool:
    """Inside ComfyUI: before it validates a queued prompt, build the built-in tiny models, fixture LoRAs and
    example input images the prompt names and that are missing, as ``lorabind run`` and ``serve`` do (an example
    template opened in a fresh ComfyUI names ``lorabind-tiny/...`` files nothing has built yet, and ComfyUI's
    validation would refuse them as not in the list). Through ComfyUI's on-prompt handlers, once per server; the
    build writes only the built-in folders (``lorabind-tiny/``, ``diffusers/tiny-*``). False headless."""
    try:
        server = importlib.import_module("server").PromptServer.instance
        add_handler = server.add_on_prompt_handler
    except Exception:  # headless, or a ComfyUI whose server is not running (or has no on-prompt handlers)
        return False
    if any(getattr(handler, _PROMPT_HANDLER_MARK, False) for handler in getattr(server, "on_prompt_handlers", ())):
        return True  # the pack imported twice

    def build_what_the_prompt_names(json_data):
        prompt = json_data.get("prompt") if isinstance(json_data, dict) else None
        if isinstance(prompt, dict):
            paths = folder_paths()
            ensure_builtins_for_prompt(prompt, paths.models_dir, paths.get_input_directory(),
                                       announce=lambda line: print(f"[lorabind] {line}", flush=True))
        return json_data

    setattr(build_what_the_prompt_names, _PROMPT_HANDLER_MARK, True)
    add_handler(build_what_the_prompt_names)
    return True


def check_interrupted() -> None:
    """Raise if the user interrupted the running prompt (ComfyUI's or the runtime's interrupt)."""
    mods = _comfy_modules()
    if mods is not None:
        mods[2].throw_exception_if_processing_interrupted()
        return
    ctx = host.current_context()
    if ctx is not None:
        ctx.check_interrupted()


class ProgressBar:
    """Per-node progress: ComfyUI's ProgressBar inside ComfyUI, the runtime's progress events headless."""

    def __init__(self, total: int):
        self.total = int(total)
        self.value = 0
        mods = _comfy_modules()
        self._comfy_bar = mods[1].ProgressBar(self.total) if mods is not None else None

    def update_absolute(self, value: int, extra: dict | None = None, total: int | None = None,
                        preview=None) -> None:
        """Set the progress to ``value`` (of ``total``, which may change: e.g. fuse layers, then steps), with the
        step's live preview when there is one (``step_preview``'s)."""
        self.value = int(value)
        if total is not None:
            self.total = int(total)
        if self._comfy_bar is not None:
            self._comfy_bar.update_absolute(self.value, self.total, preview)
            return
        ctx = host.current_context()
        if ctx is not None:
            ctx.report_progress(self.value, self.total, extra)
            if preview is not None:
                ctx.report_preview(self.value, self.total, preview)


def step_preview(model, latent):
    """A sampler run's live preview, ``preview(done, total, denoised)`` -> what ``ProgressBar.update_absolute``
    sends (None: skipped this step), or None when no preview method is set: the sampler then computes nothing.

    Inside ComfyUI it is ComfyUI's own previewer (``latent_preview``), so the user's ``--preview-method`` (and
    0.30's per-prompt setting) applies: on ComfyUI's class for the latent space our family names, whose TAESD-type
    decoder it finds in ``models/vae_approx``, else on a format carrying our map (a ComfyUI without that class, or
    a tiny model's latent). Headless it is the runtime's settings for this prompt (``usecases.previews``)."""
    mods = _comfy_modules()
    if mods is None:
        options = getattr(host.current_context(), "previews", None)
        return None if options is None else step_previewer(model, latent, options.method, options.max_size,
                                                           options.interval_ms / 1000.0)
    rgb = preview_map(model, latent)
    formats = importlib.import_module("comfy.latent_formats")
    comfy_class = getattr(formats, rgb.comfy_format, None) if rgb.comfy_format else None
    latent_format = comfy_class() if comfy_class is not None else formats.LatentFormat()
    if comfy_class is None:
        latent_format.latent_channels = rgb.channels
        latent_format.latent_rgb_factors = [list(row) for row in rgb.factors]
        latent_format.latent_rgb_factors_bias = list(rgb.bias)
    device = mods[2].get_torch_device()
    previewer = importlib.import_module("latent_preview").get_previewer(device, latent_format)
    if previewer is None:
        return None
    return lambda done, total, denoised: previewer.decode_latent_to_preview_image("JPEG", denoised.to(device))


def default_device():
    """ComfyUI's torch device inside ComfyUI (what its own models use), None headless (the session default)."""
    mods = _comfy_modules()
    if mods is None:
        return None
    return mods[2].get_torch_device()


def free_device_memory(nbytes: int, device) -> None:
    """Before our weights take ``nbytes`` on ``device``, let ComfyUI unload its own models to make room, so the
    two do not fight over VRAM (a no-op headless)."""
    mods = _comfy_modules()
    if mods is not None:
        mods[2].free_memory(int(nbytes), device)


_UNLOAD_HOOK_MARK = "_lorabind_releases_too"


def follow_comfyui_memory_management() -> bool:
    """Inside ComfyUI, at pack import: our models follow ComfyUI's memory controls from the start, before any
    model loads. "Unload models" (its ``/free`` route, the button, out-of-memory recovery) gives our device
    memory back; "Free model and node cache" also drops ComfyUI's node cache, and with it our models, since
    the model store then keeps a model only while a cached handle holds it. False headless."""
    if not install_unload_hook():
        return False

    follow_host_node_cache()
    return True


def install_unload_hook() -> bool:
    """Make ComfyUI's ``model_management.unload_all_models`` release our models' device memory too. ComfyUI has
    no callback registry for this, so we wrap it once; the wrapper calls ours, then ComfyUI's. False headless."""
    mods = _comfy_modules()
    if mods is None:
        return False
    model_management = mods[2]
    current = getattr(model_management, "unload_all_models", None)
    if current is None:  # a ComfyUI without it has no unload control to follow
        return False
    if getattr(current, _UNLOAD_HOOK_MARK, False):
        return True

    def unload_all_models(*args, **kwargs):
        release_device_memory()  # folder and single-file models share the cache
        return current(*args, **kwargs)

    setattr(unload_all_models, _UNLOAD_HOOK_MARK, True)
    unload_all_models.__wrapped__ = current
    model_management.unload_all_models = unload_all_models
    return True


class WorkProgress:
    """Progress of work inside a node that is not a sampling step (fusing / restoring LoRA layers).

    Why not ProgressBar: ComfyUI clients read every ``progress`` message as a sampling step, so 76 fuse layers
    would show as 76 steps. Inside ComfyUI this updates its per-node progress state (the ``progress_state``
    message) and shows ``label`` as the node's progress text; ComfyUI versions without those show nothing.
    Headless it reaches the runtime's ``progress_state`` event."""

    def __init__(self, label: str):
        self.label = label
        self._announced = False

    def update(self, value: int, total: int) -> None:
        if _comfy_modules() is not None:
            self._update_comfy(int(value), int(total))
            return
        ctx = host.current_context()
        if ctx is not None:
            ctx.report_work(self.label, int(value), int(total))

    def _update_comfy(self, value: int, total: int) -> None:
        try:
            progress = importlib.import_module("comfy_execution.progress")
            executing = importlib.import_module("comfy_execution.utils").get_executing_context()
        except Exception:  # an older ComfyUI: no per-node progress state to report into
            return
        if executing is None:
            return
        if not self._announced:
            self._announced = True
            try:
                server = importlib.import_module("server").PromptServer.instance
                server.send_progress_text(self.label, executing.node_id)
            except Exception:  # progress text is a courtesy; older servers lack it
                pass
        progress.get_progress_state().update_progress(executing.node_id, value, total, None)


# --------------------------------------------------------------------------------------------------------------
# ComfyUI's own MODEL (the ComfyUI-native nodes): its weight patches and its sampler wrappers


def require_comfyui(node: str) -> None:
    """The ComfyUI-native nodes work on ComfyUI's own MODEL; headless there is none, so say so by node name."""
    if _comfy_modules() is None:
        raise LoraBindError(f"{node} works on ComfyUI's own MODEL and needs ComfyUI: it runs only inside ComfyUI. "
                            "In lorabind run/serve use LoraBindModelLoader with FuseDistillLoRA / WanMoELoRAPair "
                            "and LoraBindSampler instead")
