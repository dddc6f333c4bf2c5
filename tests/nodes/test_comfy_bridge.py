"""Inside ComfyUI the pack uses ComfyUI's folder_paths, ProgressBar and interrupt; ComfyUI imports it by path.

ComfyUI is not installed here, so its three modules are stood in by fakes that record how they are called.
"""

import contextlib
import importlib
import importlib.util
import os
import pathlib
import sys
import types

import pytest

from comfyui_stubs import install_comfyui_modules
from lorabind.nodes import comfy_bridge


@pytest.fixture
def fake_comfyui(monkeypatch, tmp_path):
    calls = []

    class FakeProgressBar:
        def __init__(self, total):
            calls.append(("ProgressBar", total))

        def update_absolute(self, value, total=None, preview=None):  # ComfyUI's signature
            calls.append(("update_absolute", value, total))

    folder_paths = types.SimpleNamespace(
        get_filename_list=lambda kind: [f"{kind}-from-comfyui.safetensors"],
        get_full_path=lambda kind, name: str(tmp_path / kind / name),  # inside its folder, as ComfyUI gives it
        get_folder_paths=lambda kind: [str(tmp_path / kind)],
    )
    install_comfyui_modules(monkeypatch, folder_paths, utils=types.SimpleNamespace(ProgressBar=FakeProgressBar),
                            model_management=types.SimpleNamespace(
                                throw_exception_if_processing_interrupted=lambda: calls.append(("interrupt-check",))))
    yield folder_paths, calls
    comfy_bridge._comfy_modules.cache_clear()


def test_bridge_uses_comfyui_modules_when_present(fake_comfyui):
    folder_paths, calls = fake_comfyui
    assert comfy_bridge.folder_paths() is folder_paths
    bar = comfy_bridge.ProgressBar(4)
    bar.update_absolute(2)
    bar.update_absolute(3, total=9)
    comfy_bridge.check_interrupted()
    assert calls == [("ProgressBar", 4), ("update_absolute", 2, 4), ("update_absolute", 3, 9), ("interrupt-check",)]


def test_bridge_falls_back_to_the_runtime_without_comfyui():
    from lorabind.runtime import folder_paths as runtime_folder_paths

    comfy_bridge._comfy_modules.cache_clear()
    assert comfy_bridge.folder_paths() is runtime_folder_paths


def test_comfyui_style_import_by_path_lists_our_nodes_from_comfyui_folders(fake_comfyui, tmp_path):
    """ComfyUI loads custom_nodes/<pack>/__init__.py by path, naming the module after the full path with every
    "." replaced by "_x_" (so only relative imports can work). LoRAs are listed from ComfyUI's loras folders."""
    (tmp_path / "loras").mkdir()
    (tmp_path / "loras" / "loras-from-comfyui.safetensors").write_bytes(b"x")
    with _pack_loaded_by_path() as (module, _):
        mappings = module.NODE_CLASS_MAPPINGS
        assert module.WEB_DIRECTORY == "./web"
        assert {"LoadPEFTAdapter", "FuseDistillLoRA", "WanMoELoRAPair", "MiniMaxTurboSchedule",
                "LoraBindSampler"} <= set(mappings)
        loras = mappings["LoadPEFTAdapter"].INPUT_TYPES()["required"]["lora_name"][0]
        assert loras == ["loras-from-comfyui.safetensors"]


@contextlib.contextmanager
def _pack_loaded_by_path():
    """The pack imported as ComfyUI does it: (package module, its module name)."""
    root = pathlib.Path(comfy_bridge.__file__).resolve().parents[1]
    module_name = str(root).replace(".", "_x_")
    spec = importlib.util.spec_from_file_location(module_name, root / "__init__.py",
                                                  submodule_search_locations=[str(root)])
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    try:
        spec.loader.exec_module(module)
        yield module, module_name
    finally:
        for name in [n for n in sys.modules if n == module_name or n.startswith(module_name + ".")]:
            del sys.modules[name]


def test_peft_folders_are_offered_and_resolved_inside_comfyui(monkeypatch, tmp_path):
    """ComfyUI lists and finds only files under models/loras (a PEFT folder's inner weight file and pickle files
    too); the pack lists by the headless rule: PEFT folders as themselves, safetensors only."""
    from lorabind.nodes import adapter_nodes
    from lorabind.runtime import folder_paths as runtime_folder_paths

    loras = tmp_path / "loras"
    (loras / "styles" / "ink").mkdir(parents=True)
    (loras / "styles" / "ink" / "adapter_config.json").write_text("{}")
    (loras / "styles" / "ink" / "adapter_model.safetensors").write_bytes(b"x")
    (loras / "plain.safetensors").write_bytes(b"x")
    (loras / "old.ckpt").write_bytes(b"x")
    files_only = types.SimpleNamespace(
        get_filename_list=lambda kind: ["old.ckpt", "plain.safetensors", "styles/ink/adapter_model.safetensors"],
        get_full_path=lambda kind, name: str(loras / name) if (loras / name).is_file() else None,
        get_folder_paths=lambda kind: [str(loras)])
    install_comfyui_modules(monkeypatch, files_only)
    try:
        assert adapter_nodes.lora_choices() == ["plain.safetensors", "styles/ink"]
        assert runtime_folder_paths.lora_names([str(loras)]) == adapter_nodes.lora_choices()  # the headless rule
        assert adapter_nodes.resolve_lora("styles/ink", "lora_name", "LoadPEFTAdapter") == str(loras / "styles" / "ink")
        with pytest.raises(ValueError, match="'..' would leave"):
            comfy_bridge.lora_full_path("../loras/styles/ink")
    finally:
        comfy_bridge._comfy_modules.cache_clear()


def test_bind_work_inside_comfyui_is_progress_state_and_text_never_step_progress(fake_comfyui, monkeypatch):
    """ComfyUI clients read ``progress`` as sampling steps: fuse layers go to ComfyUI's per-node progress state
    (the ``progress_state`` message) with a progress text, never through ProgressBar."""
    _, calls = fake_comfyui
    registry = types.SimpleNamespace(update_progress=lambda node, value, total, image: calls.append(
        ("progress_state", node, value, total, image)))
    progress = types.SimpleNamespace(get_progress_state=lambda: registry)
    utils = types.SimpleNamespace(get_executing_context=lambda: types.SimpleNamespace(node_id="6", prompt_id="p"))
    server = types.SimpleNamespace(PromptServer=types.SimpleNamespace(instance=types.SimpleNamespace(
        send_progress_text=lambda text, node: calls.append(("text", text, node)))))
    for name, module in (("comfy_execution", types.ModuleType("comfy_execution")),
                         ("comfy_execution.progress", progress), ("comfy_execution.utils", utils),
                         ("server", server)):
        monkeypatch.setitem(sys.modules, name, module)
    work = comfy_bridge.WorkProgress("binding LoRA layers")
    for done in (1, 2, 3):
        work.update(done, 3)
    assert calls == [("text", "binding LoRA layers", "6"), ("progress_state", "6", 1, 3, None),
                     ("progress_state", "6", 2, 3, None), ("progress_state", "6", 3, 3, None)]
    # an older ComfyUI without comfy_execution.progress: nothing is reported, and nothing as steps either
    monkeypatch.setitem(sys.modules, "comfy_execution.progress", None)
    calls.clear()
    comfy_bridge.WorkProgress("binding LoRA layers").update(1, 3)
    assert calls == []


def test_error_types_reach_comfyui_by_their_plain_name(fake_comfyui):
    """ComfyUI reports ``exception_type`` as ``full_type_name``: module + qualname unless the module is builtins.
    Loaded by path, our module name would be the folder path (``…custom_nodes/lorabind.loaders.errors``)."""
    import pickle

    def full_type_name(klass):  # ComfyUI's execution.full_type_name
        module = klass.__module__
        return klass.__qualname__ if module == "builtins" else module + "." + klass.__qualname__

    with _pack_loaded_by_path() as (_, module_name):
        errors = importlib.import_module(f"{module_name}.loaders.errors")
        adapters = importlib.import_module(f"{module_name}.loaders.binding.peft_adapters")
        assert full_type_name(errors.ContractError) == "ContractError"
        assert full_type_name(errors.LoraFileError) == "LoraFileError"
        assert full_type_name(adapters.AdapterError) == "AdapterError"
        again = pickle.loads(pickle.dumps(errors.ContractError("steps must be 4")))
        assert isinstance(again, errors.ContractError) and str(again) == "steps must be 4"


def test_model_loader_is_changed_carries_no_local_path(tmp_path):
    from lorabind.nodes.model_nodes import LoraBindModelLoader
    from lorabind.runtime import folder_paths as runtime_folder_paths

    folder = tmp_path / "models" / "diffusers" / "tiny"
    folder.mkdir(parents=True)
    (folder / "model_index.json").write_text("{}")
    runtime_folder_paths.configure(models_root=str(tmp_path / "models"))
    comfy_bridge._comfy_modules.cache_clear()
    try:
        first = LoraBindModelLoader.IS_CHANGED("tiny", "auto")
        assert str(tmp_path) not in first and "model_index.json" not in first and first.startswith("tiny:")
        stat = (folder / "model_index.json").stat()
        os.utime(folder / "model_index.json", ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
        assert LoraBindModelLoader.IS_CHANGED("tiny", "auto") != first  # a rebuilt folder still re-runs
    finally:
        runtime_folder_paths.configure()


def test_save_audio_is_filed_with_the_other_savers():
    from lorabind.nodes import NODE_CLASS_MAPPINGS

    assert NODE_CLASS_MAPPINGS["LoraBindSaveAudio"].CATEGORY == NODE_CLASS_MAPPINGS["LoraBindSaveImage"].CATEGORY


def test_lora_symlinks_out_of_the_loras_folders_are_refused_and_not_listed(registry_at, tmp_path):
    from lorabind.loaders.errors import LoraFileError
    from lorabind.nodes.adapter_nodes import resolve_lora

    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "secret.safetensors").write_bytes(b"not for the loras folder")
    (outside / "adapter_model.safetensors").write_bytes(b"nor this")
    loras = tmp_path / "models" / "loras"
    loras.mkdir(parents=True)
    (loras / "mine.safetensors").write_bytes(b"a real one")
    (loras / "alias.safetensors").symlink_to(loras / "mine.safetensors")  # inside: fine
    (loras / "escape.safetensors").symlink_to(outside / "secret.safetensors")
    peft = loras / "peft_escape"
    peft.mkdir()
    (peft / "adapter_config.json").write_text("{}")
    (peft / "adapter_model.safetensors").symlink_to(outside / "adapter_model.safetensors")
    linked_root = tmp_path / "linked_models"  # a whole models folder linked from another disk stays usable
    linked_root.symlink_to(tmp_path / "models", target_is_directory=True)
    for root in (tmp_path / "models", linked_root):
        registry_at(root)
        assert comfy_bridge.lora_names() == ["alias.safetensors", "mine.safetensors"]
        assert comfy_bridge.lora_full_path("alias.safetensors") is not None
        for name in ("escape.safetensors", "peft_escape"):
            assert comfy_bridge.lora_full_path(name) is None
            with pytest.raises(LoraFileError, match=f"'{name}' is not in the loras folder .*symlink"):
                resolve_lora(name, "lora_name", "FuseDistillLoRA")


def test_inside_comfyui_a_queued_prompt_gets_the_builtin_files_it_names_built_before_validation(fake_comfyui,
                                                                                                  monkeypatch):
    """Issue 57: a template opened in a fresh ComfyUI named fixture LoRAs nothing had built, and ComfyUI's
    validation refused them. The pack adds one on-prompt handler (ComfyUI runs those before it validates), which
    builds what the prompt names into ComfyUI's models and input folders; registering twice adds it once."""
    folder_paths, _ = fake_comfyui
    folder_paths.models_dir, folder_paths.get_input_directory = "/comfy/models", lambda: "/comfy/input"
    handlers, built = [], []
    server = types.SimpleNamespace(on_prompt_handlers=handlers, add_on_prompt_handler=handlers.append)
    monkeypatch.setitem(sys.modules, "server", types.SimpleNamespace(PromptServer=types.SimpleNamespace(
        instance=server)))
    monkeypatch.setattr(comfy_bridge, "ensure_builtins_for_prompt",
                        lambda prompt, models, inputs, announce: built.append((prompt, models, inputs)))
    assert comfy_bridge.build_builtins_on_prompt() and comfy_bridge.build_builtins_on_prompt()
    (handler,) = handlers
    body = {"prompt": {"1": {"class_type": "FuseDistillLoRA", "inputs": {"lora_name": "lorabind-tiny/x"}}}}
    assert handler(body) is body  # handed back unchanged for ComfyUI to validate
    assert built == [(body["prompt"], "/comfy/models", "/comfy/input")]
    assert handler({"no prompt": 1}) == {"no prompt": 1} and len(built) == 1
