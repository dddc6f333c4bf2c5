"""`lorabind serve --max-cached-adapters N --preload-adapter NAME`: the PEFT adapter cache evicts at the configured
size and never evicts a preloaded adapter; the loader's `max_cached_adapters` input sets one model's size."""

from __future__ import annotations

import os
import shutil

from lorabind.loaders.binding import bind as binding
from lorabind.loaders.handles import AdapterSpec
from lorabind.loaders.models.store import load_model
from lorabind.runtime.commands import serve
from lorabind.tiny_models.lora_fixtures import PEFT_FOLDER


def test_cache_size_and_preloaded_adapter_from_the_command_line(tiny_models_root, tmp_path, cache_defaults_restored, serve_args):
    loras = tiny_models_root / "loras"
    copies = []
    for name in ("a", "b"):  # three distinct adapters: the fixture folder and two copies of it
        copy = loras / "lorabind-tiny" / f"cache-test-{name}"
        shutil.copytree(loras / PEFT_FOLDER, copy, dirs_exist_ok=True)
        copies.append(str(copy))
    preloaded = str(loras / PEFT_FOLDER)
    args = serve_args("--models", tiny_models_root, "--max-cached-adapters", "2", "--preload-adapter", PEFT_FOLDER)
    assert serve.apply_adapter_cache_arguments(args) is None

    # a model of its own (another dtype than the session's shared one), so its cache starts empty here
    model = load_model(tiny_models_root / "diffusers" / "tiny-wan21-t2v", dtype="float32")
    model.binding_state = None
    try:
        for path in (preloaded, *copies):
            binding.bind(model, (), (AdapterSpec(path=path, scale=1.0),))
        cache = binding.binding_state(model).adapters
        cached = {key[0] for key in cache.entries}
        assert cache.max_size == 2
        assert cached == {os.path.realpath(preloaded), os.path.realpath(copies[1])}  # b evicted, the pinned kept
    finally:
        binding.unbind(model)
        binding.binding_state(model).adapters.remove_all()


def test_bad_cache_arguments_are_refused_at_start(tiny_models_root, cache_defaults_restored, serve_args):
    assert "at least 1" in serve.apply_adapter_cache_arguments(
        serve_args("--models", tiny_models_root, "--max-cached-adapters", "0"))
    message = serve.apply_adapter_cache_arguments(serve_args("--models", tiny_models_root, "--preload-adapter", "nope"))
    assert message.startswith("--preload-adapter nope: not found")


def test_the_loader_input_sets_one_models_cache_size(tiny_models_root, registry):
    from lorabind.nodes.model_nodes import LoraBindModelLoader

    spec = LoraBindModelLoader.INPUT_TYPES()["optional"]["max_cached_adapters"][1]
    assert spec["default"] == 0 and spec["min"] == 0
    (handle,) = LoraBindModelLoader().load("tiny-wan21-t2v", max_cached_adapters=7)
    assert binding.binding_state(handle.model).adapters.max_size == 7
    binding.set_adapter_cache_size(handle.model, binding.DEFAULT_MAX_CACHED_ADAPTERS)
