"""Issue 46: a LoRA input naming a 0-byte file is refused when the prompt is validated, as not a safetensors
file, before any model loads (it was queued, loaded the model, then failed as a contract mismatch)."""

from __future__ import annotations

from types import SimpleNamespace

from lorabind.runtime.core_nodes import runtime_node_classes
from lorabind.runtime.executor.validation import ValidationResult
from lorabind.runtime.server.comfy_api import prompt_service
from lorabind.usecases.prompt_contracts import unreadable_lora_refusals


def _prompt(lora_name: str) -> dict:
    return {"5": {"class_type": "FuseDistillLoRA", "inputs": {"model": ["1", 0], "lora_name": lora_name,
                                                              "strength": 1.0}}}


def test_a_zero_byte_lora_is_refused_at_validation_naming_the_node_and_input(registry_at, tmp_path):
    loras = tmp_path / "models" / "loras"
    loras.mkdir(parents=True)
    (loras / "empty.safetensors").write_bytes(b"")
    (loras / "short.safetensors").write_bytes(b"\x10\0\0\0\0\0\0\0{}")  # a header longer than the file
    registry = registry_at(tmp_path / "models")
    assert unreadable_lora_refusals(_prompt("empty.safetensors"), registry) == [
        ("5", "lora_name", "empty.safetensors: not a safetensors file (only 0 bytes; truncated?)")]
    assert "header claims 16 bytes" in unreadable_lora_refusals(_prompt("short.safetensors"), registry)[0][2]
    assert unreadable_lora_refusals(_prompt("missing.safetensors"), registry) == []  # the list check reports it

    state = SimpleNamespace(node_classes=runtime_node_classes()[0])
    result = prompt_service._refuse_contract_mismatches(
        state, ValidationResult(True, None, ["5"], {}, _prompt("empty.safetensors")))
    assert not result.ok
    error, = result.node_errors["5"]["errors"]
    assert (error["extra_info"]["lorabind_refusal"], error["extra_info"]["input_name"]) == ("invalid_lora_file", "lora_name")
    assert error["type"] == "exception_during_inner_validation"  # a type the editor shows with its text
    assert "not a safetensors file" in error["details"] and result.node_errors["5"]["dependent_outputs"] == ["5"]


def test_another_familys_lora_is_refused_at_validation_before_any_model_loads(tiny_models_root, monkeypatch):
    """Issue 54: Qwen-Image Lightning in the Wan2.2 pair is refused with the prompt's validation (a 400 naming the
    node and input, in the editor's toast and Issues panel), read from the files: no model is loaded for it."""
    import json
    from pathlib import Path

    import lorabind
    import lorabind.usecases.models as models
    from prompt_refusals import refused_early

    monkeypatch.setattr(models, "load_folder", lambda *a, **k: (_ for _ in ()).throw(AssertionError("loaded")))
    prompt = json.loads((Path(lorabind.__file__).parent / "workflows" / "api" / "wan22_lightx2v_4step.api.json").read_text())
    prompt["5"]["inputs"]["high_noise_lora"] = "lorabind-tiny/Qwen-Image-Lightning-4steps-V1.0.safetensors"
    result = refused_early(prompt, tiny_models_root)
    assert not result.ok
    error, = result.node_errors["5"]["errors"]
    assert error["extra_info"] == {"input_name": "high_noise_lora", "lorabind_refusal": "lora_for_another_family",
                                   "received_value": "lorabind-tiny/Qwen-Image-Lightning-4steps-V1.0.safetensors"}
    assert error["type"] == "exception_during_inner_validation" and error["message"] == \
        "Value is a LoRA for another model"
    assert "is a qwen_image LoRA" in error["details"] and "lenient" not in error["details"]
