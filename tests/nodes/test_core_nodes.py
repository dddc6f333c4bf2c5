"""The model loader's folder handling, the sampler's order of work, and the ``lorabind models build-tiny``
command."""

import pytest

from lorabind.loaders.binding import bind as binding
from lorabind.loaders.contracts.sigmas import shifted_sigmas
from lorabind.loaders.errors import ContractError
from lorabind.loaders.handles import ScheduleContract
from lorabind.nodes import model_nodes
from lorabind.nodes.conditioning_nodes import LoraBindTextEncode
from lorabind.nodes.latent_nodes import LoraBindEmptyLatent
from lorabind.nodes.model_nodes import LoraBindModelLoader
from lorabind.nodes.sampler_nodes import LoraBindSampler
from lorabind.runtime import folder_paths
from lorabind.runtime.cli import main as cli_main


@pytest.fixture
def models_configured(registry, tiny_models_root):
    return tiny_models_root


def test_sampler_input_order_is_the_final_form():
    spec = LoraBindSampler.INPUT_TYPES()
    assert list(spec["required"]) == ["model", "positive", "negative", "latent", "seed", "steps", "cfg", "shift",
                                      "boundary", "enforce_contract"]
    # the staged-sampling inputs come after the older ones: saved workflows keep their positional widget values
    assert list(spec["optional"]) == ["adapter", "schedule", "cfg_low_noise", "audio_flow_shift", "sigmas",
                                      "scheduler", "start_step", "end_step", "denoise", "add_noise"]
    assert spec["required"]["seed"][1]["control_after_generate"] is True
    assert spec["required"]["shift"][1]["default"] == 5.0 and spec["required"]["enforce_contract"][1]["default"]


def test_loader_lists_built_models_and_refuses_escaping_names(models_configured, tmp_path):
    names = LoraBindModelLoader.INPUT_TYPES()["required"]["model_name"][0]
    assert {"tiny-wan22-t2v", "tiny-wan21-t2v", "tiny-qwen-image"} <= set(names)
    for bad in ("../diffusers/tiny-wan21-t2v", str(tmp_path)):
        with pytest.raises(ValueError, match="model_name"):
            model_nodes.resolve_model_folder(bad)
    with pytest.raises(FileNotFoundError, match="not-a-model"):
        model_nodes.resolve_model_folder("not-a-model")
    changed = LoraBindModelLoader.IS_CHANGED("tiny-wan21-t2v", "auto")
    assert changed.startswith("tiny-wan21-t2v:") and changed.endswith(":auto") and changed != "tiny-wan21-t2v:missing:auto"
    assert str(models_configured) not in changed  # embedded in outputs: no local path
    assert LoraBindModelLoader.IS_CHANGED("tiny-wan21-t2v", "auto") == changed  # nothing changed: the same value


def test_loader_builds_a_missing_builtin_model_on_first_use(tmp_path):
    folder_paths.configure(models_root=str(tmp_path))
    try:
        assert "tiny-wan21-t2v" in LoraBindModelLoader.INPUT_TYPES()["required"]["model_name"][0]
        assert "missing" in LoraBindModelLoader.IS_CHANGED("tiny-wan21-t2v", "auto")
        assert not (tmp_path / "diffusers").exists(), "IS_CHANGED must not build anything"
        (handle,) = LoraBindModelLoader().load("tiny-wan21-t2v", "auto")
    finally:
        folder_paths.configure()
    assert (tmp_path / "diffusers" / "tiny-wan21-t2v" / "model_index.json").is_file()
    assert handle.family == "wan2.1" and handle.contracts == ()


def test_sampler_refuses_a_contract_mismatch_before_binding(models_configured, monkeypatch):
    (handle,) = LoraBindModelLoader().load("tiny-wan22-t2v", "auto")
    contract = ScheduleContract(source="distill_4step.safetensors", kind="distill", family="wan2.2_moe", steps=4,
                                sigmas=shifted_sigmas(4, 5.0), shift=5.0, cfg=1.0)
    handle = handle.with_fuses(contracts=(contract,))
    binds = []
    monkeypatch.setattr(binding, "bind", lambda *a, **k: binds.append(a))
    encode = LoraBindTextEncode()
    (pos,), (neg,) = encode.encode(handle, "a cat"), encode.encode(handle, "blurry")
    (latent,) = LoraBindEmptyLatent().generate(handle, 32, 32, 5, 1)
    with pytest.raises(ContractError, match="distill_4step.safetensors"):
        LoraBindSampler().sample(handle, pos, neg, latent, 0, 8, 1.0, 5.0, 0.0, True)
    assert binds == []


@pytest.mark.slow
def test_sampler_reports_the_resolved_schedule(models_configured):
    (handle,) = LoraBindModelLoader().load("tiny-wan22-t2v", "auto")
    encode = LoraBindTextEncode()
    (pos,), (neg,) = encode.encode(handle, "a cat"), encode.encode(handle, "blurry")
    (latent,) = LoraBindEmptyLatent().generate(handle, 32, 32, 5, 1)
    out = LoraBindSampler().sample(handle, pos, neg, latent, 3, 4, 5.0, 3.0, 0.9, True)
    (report,) = out["ui"]["lorabind_schedule"]
    assert report["sigmas"] == pytest.approx(shifted_sigmas(4, 3.0))
    assert report["boundary"] == 0.9 and report["cfg"] == 5.0 and report["steps"] == 4
    assert report["experts"] == ["transformer" if s >= 0.9 else "transformer_2" for s in report["sigmas"][:-1]]
    assert out["result"][0].samples.shape == latent.samples.shape


def test_build_tiny_command_prints_what_it_wrote(tmp_path, capsys):
    assert cli_main(["models", "build-tiny", "--models", str(tmp_path), "--only", "tiny-wan21-t2v"]) == 0
    printed = capsys.readouterr().out
    assert f"wrote {tmp_path / 'diffusers' / 'tiny-wan21-t2v'}" in printed
    assert cli_main(["models", "build-tiny", "--models", str(tmp_path), "--only", "tiny-nope"]) == 2
    assert "tiny-nope" in capsys.readouterr().err


def test_build_tiny_keeps_what_is_current_and_force_rebuilds_it(tmp_path, capsys):
    """Issue 54: build-tiny rewrote everything even when it was current (deterministic builds: the same bytes)."""
    folder = tmp_path / "diffusers" / "tiny-wan21-t2v"
    arguments = ["models", "build-tiny", "--models", str(tmp_path), "--only", "tiny-wan21-t2v"]
    assert cli_main(arguments) == 0 and f"wrote {folder}" in capsys.readouterr().out
    weights = sorted(folder.rglob("*.safetensors"))
    stamps = {path: path.stat().st_mtime_ns for path in weights}
    assert cli_main(arguments) == 0
    printed = capsys.readouterr().out
    assert "wrote" not in printed and "0 item(s) written" in printed and "--force rebuilds it" in printed
    assert weights and {path: path.stat().st_mtime_ns for path in weights} == stamps  # not touched
    assert cli_main([*arguments, "--force"]) == 0 and f"wrote {folder}" in capsys.readouterr().out
    assert any(path.stat().st_mtime_ns != stamps[path] for path in weights)


@pytest.mark.slow  # builds every tiny model once
def test_a_second_build_tiny_writes_nothing_and_a_missing_fixture_is_written_again(tmp_path, capsys):
    from lorabind.tiny_models import build_tiny
    from lorabind.tiny_models.lora_fixtures import WAN22_HIGH

    first = build_tiny(tmp_path / "models", input_dir=tmp_path / "input")
    assert first and build_tiny(tmp_path / "models", input_dir=tmp_path / "input") == []
    (tmp_path / "models" / "loras" / WAN22_HIGH).unlink()
    again = build_tiny(tmp_path / "models", input_dir=tmp_path / "input")
    assert tmp_path / "models" / "loras" / WAN22_HIGH in again and not any(p.name == "model_index.json" or
                                                                           p.parent.name == "diffusers" for p in again)


def test_an_oversized_latent_is_refused_at_validation_with_its_size():
    from lorabind.nodes import NODE_CLASS_MAPPINGS
    from lorabind.runtime.executor import PromptExecutor

    prompt = {"1": {"class_type": "LoraBindModelLoader", "inputs": {"model_name": "tiny-wan22-t2v", "dtype": "auto"}},
              "2": {"class_type": "LoraBindEmptyLatent",
                    "inputs": {"model": ["1", 0], "width": 8192, "height": 8192, "frames": 1025, "batch_size": 64}},
              "3": {"class_type": "LoraBindVAEDecode", "inputs": {"model": ["1", 0], "latent": ["2", 0]}},
              "4": {"class_type": "LoraBindSaveImage", "inputs": {"images": ["3", 0], "filename_prefix": "x"}}}
    validation = PromptExecutor(NODE_CLASS_MAPPINGS, cache=False).validate(prompt)
    assert not validation.ok
    message = str(validation.node_errors["2"]["errors"])
    assert "needs at least 1028.0 GiB (the limit is 1 GiB)" in message


@pytest.mark.parametrize("width, height, frames, axis", [(1024, 1024, 81, "height"), (8192, 8192, 1, "height"),
                                                         (64, 64, 137, "frames")])
def test_a_latent_beyond_the_models_positions_is_a_clear_error(load_tiny, width, height, frames, axis):
    from lorabind.loaders.dispatch.generation_steps import empty_latent

    with pytest.raises(ValueError, match=rf"tiny-wan22-t2v places at most 32 latent positions along {axis}"):
        empty_latent(load_tiny("tiny-wan22-t2v"), width=width, height=height, frames=frames)
