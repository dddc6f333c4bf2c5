"""Device names, session defaults (``--device``/``--memory``) and the speed options refuse clearly on this CPU."""

import pytest
import torch

from lorabind.loaders.errors import ModelLoadError
from lorabind.loaders.placement import devices, speed


@pytest.fixture(autouse=True)
def clean_defaults():
    devices.set_session_defaults()
    yield
    devices.set_session_defaults()


def test_auto_follows_the_session_default_then_the_best_device_present(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert devices.resolve_device("auto") == torch.device("cpu")
    assert devices.resolve_device(None, default=torch.device("cpu")) == torch.device("cpu")
    devices.set_session_defaults(device="cpu", memory="offload_blocks")
    assert devices.resolve_device("auto") == torch.device("cpu")
    assert devices.resolve_memory("auto") == "offload_blocks"
    assert devices.resolve_memory("full") == "full"  # an explicit plan wins over the session default


@pytest.mark.parametrize("name, message", [
    ("gpu", "unknown device 'gpu'; choose auto, cpu, cuda, cuda:N or mps"),
    ("cuda:x", "unknown device 'cuda:x'"),
])
def test_bad_device_names_are_refused(name, message):
    with pytest.raises(ModelLoadError, match=message.replace("(", r"\(").replace(")", r"\)")):
        devices.resolve_device(name)
    with pytest.raises(ModelLoadError):
        devices.set_session_defaults(device=name)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without CUDA")
def test_cuda_without_cuda_says_so():
    with pytest.raises(ModelLoadError, match="sees no CUDA device; use device=cpu"):
        devices.resolve_device("cuda:0")
    assert devices.device_choices() == ["auto", "cpu", "cuda", "mps"]


def test_unknown_memory_plan_is_refused():
    with pytest.raises(ModelLoadError, match="unknown memory plan 'tiny'"):
        devices.resolve_memory("tiny")


def test_device_memory_on_the_cpu_is_system_ram():
    free, total = devices.device_memory("cpu")
    host_total, host_free = devices.host_memory()
    assert total == host_total > 0 and 0 < free <= total


def test_cuda_only_attention_backend_on_the_cpu_names_the_device_and_what_is_usable():
    with pytest.raises(ModelLoadError) as info:
        speed.check_attention("flash", torch.device("cpu"))
    assert str(info.value) == "attention=flash needs a CUDA device, the model is on cpu; usable here: native"
    with pytest.raises(ModelLoadError, match="unknown attention backend 'fast'"):
        speed.check_attention("fast", torch.device("cpu"))
    speed.check_attention("native", torch.device("cpu"))


def test_missing_attention_package_is_named(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "sageattention" else real(name))
    with pytest.raises(ModelLoadError, match="attention=sage needs the Python package 'sageattention', which is not "
                                             "installed; usable here: native, cudnn"):
        speed.check_attention("sage", torch.device("cuda"))


def test_speed_options_call_diffusers_dispatcher_and_regional_compile():
    calls = []

    class Denoiser(torch.nn.Module):
        _repeated_blocks = ("Block",)

        def set_attention_backend(self, name):
            calls.append(("backend", name))

        def compile_repeated_blocks(self, **kwargs):
            calls.append(("compile", kwargs))

    speed.apply_speed_options({"transformer": Denoiser()}, attention="cudnn", compile=True)
    assert calls == [("backend", "_native_cudnn"), ("compile", {"fullgraph": True})]
    with pytest.raises(ModelLoadError, match="declares no repeated blocks"):
        speed.apply_speed_options({"transformer": torch.nn.Linear(2, 2)}, compile=True)
