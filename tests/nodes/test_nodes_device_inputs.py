"""The loader's device/memory inputs: ComfyUI's device and memory management inside ComfyUI (stand-ins), the
session defaults headless, and ``lorabind run --device/--memory`` reaching every loader."""

import sys
import types

import pytest
import torch

from lorabind.loaders.placement import devices
from lorabind.nodes import comfy_bridge
from lorabind.nodes.model_nodes import LoraBindModelLoader


@pytest.fixture
def fake_model_management(monkeypatch):
    calls = []

    def unload_all_models():
        calls.append(("comfy-unload",))

    management = types.SimpleNamespace(
        get_torch_device=lambda: torch.device("cpu"),
        free_memory=lambda nbytes, device: calls.append(("free_memory", nbytes, str(device))),
        unload_all_models=unload_all_models,
        throw_exception_if_processing_interrupted=lambda: None,
    )
    comfy = types.ModuleType("comfy")
    comfy.utils = types.SimpleNamespace(ProgressBar=lambda total: types.SimpleNamespace(
        update_absolute=lambda value, total=None: calls.append(("progress", value, total))))
    comfy.model_management = management
    folder_paths = types.SimpleNamespace(get_folder_paths=lambda kind: [])
    for name, module in (("folder_paths", folder_paths), ("comfy", comfy), ("comfy.utils", comfy.utils),
                         ("comfy.model_management", management)):
        monkeypatch.setitem(sys.modules, name, module)
    comfy_bridge._comfy_modules.cache_clear()
    yield management, calls
    comfy_bridge._comfy_modules.cache_clear()


def test_comfyui_device_is_the_default_and_its_unload_releases_ours_too(fake_model_management, monkeypatch):
    management, calls = fake_model_management
    assert comfy_bridge.default_device() == torch.device("cpu")
    comfy_bridge.free_device_memory(123, torch.device("cuda", 0))
    assert calls == [("free_memory", 123, "cuda:0")]
    released = []
    monkeypatch.setattr(comfy_bridge, "release_device_memory", lambda: released.append(1) or 0)
    assert comfy_bridge.install_unload_hook() and comfy_bridge.install_unload_hook()  # installed once
    management.unload_all_models()
    assert released == [1] and calls[-1] == ("comfy-unload",)


def test_bridge_is_inert_headless():
    comfy_bridge._comfy_modules.cache_clear()
    assert comfy_bridge.default_device() is None
    assert comfy_bridge.install_unload_hook() is False
    comfy_bridge.free_device_memory(1, torch.device("cpu"))  # nothing to free: must not raise


def test_loader_passes_device_plan_and_comfyui_hooks_to_the_model_store(monkeypatch, tmp_path):
    seen = {}
    monkeypatch.setattr("lorabind.nodes.model_nodes.resolve_model_folder", lambda name: tmp_path)
    monkeypatch.setattr("lorabind.usecases.models.checkpoint_contracts", lambda model: ())
    monkeypatch.setattr("lorabind.usecases.models.load_folder",
                        lambda folder, **kwargs: seen.update(kwargs) or types.SimpleNamespace(family="wan2.1"))
    LoraBindModelLoader().load("tiny-wan21-t2v", "auto", device="auto", memory="offload_blocks")
    assert seen["device"] is None and seen["memory"] == "offload_blocks"  # headless: the session default decides
    assert seen["before_device_alloc"] is comfy_bridge.free_device_memory
    optional = LoraBindModelLoader.INPUT_TYPES()["optional"]
    assert optional["memory"][0] == list(devices.MEMORY_NAMES) and optional["device"][1]["default"] == "auto"


@pytest.mark.slow
def test_run_command_device_and_memory_reach_every_loader(monkeypatch, tmp_path):
    """The tiny Wan2.1 workflow through ``lorabind run --device cpu --memory offload_blocks``: the loader says
    ``auto`` and the sampler's printed report shows the plan the command line chose."""
    import json
    from pathlib import Path

    import lorabind
    from lorabind.runtime.cli import main

    workflow = Path(lorabind.__file__).parent / "workflows" / "api" / "wan21_distill.api.json"
    assert json.loads(workflow.read_text())["1"]["inputs"].get("memory", "auto") == "auto"
    printed = []
    monkeypatch.setattr("builtins.print", lambda *a, **k: printed.append(" ".join(map(str, a))))
    try:
        code = main(["run", str(workflow), "--models", str(tmp_path / "models"), "--output", str(tmp_path / "out"),
                     "--device", "cpu", "--memory", "offload_blocks"])
    finally:
        devices.set_session_defaults()
    assert code == 0, printed
    line = next(p for p in printed if "memory=" in p)
    assert "memory=offload_blocks on cpu" in line and "transformer: cpu, streamed to cpu by blocks" in line


def test_run_command_refuses_a_bad_device(tmp_path, capsys):
    from lorabind.runtime.cli import main

    assert main(["run", str(tmp_path / "w.json"), "--device", "gpu0"]) == 2
    assert "--device: unknown device 'gpu0'" in capsys.readouterr().err


def test_inside_comfyui_the_pack_follows_its_memory_controls_from_import_on(fake_model_management, monkeypatch):
    """Before any model loads: the unload hook is in, and the store leaves model lifetime to ComfyUI's node cache."""
    management, calls = fake_model_management
    switched = []
    monkeypatch.setattr(comfy_bridge, "follow_host_node_cache", lambda: switched.append(1))
    assert comfy_bridge.follow_comfyui_memory_management() is True
    assert switched == [1] and management.unload_all_models._lorabind_releases_too
    monkeypatch.setitem(sys.modules, "comfy.model_management", None)  # headless: nothing to follow
    comfy_bridge._comfy_modules.cache_clear()
    assert comfy_bridge.follow_comfyui_memory_management() is False and switched == [1]
