"""The Lightning edit LoRAs' contracts (names from lightx2v's releases, reference §2.6): N steps, shift 3, cfg 1,
enforced on the edit models before any weight moves; a 20-step request is refused naming the file; an edit file
on the text-to-image model, or the reverse, is refused naming both."""

import pytest

from lorabind.loaders.contract_types import SamplingRequest
from lorabind.loaders.contracts.sigmas import shifted_sigmas
from lorabind.loaders.dispatch.contract_discovery import resolve_schedule
from lorabind.loaders.errors import ContractError
from lorabind.loaders.families.qwen_image import contracts
from lorabind.loaders.handles import ModelHandle
from lorabind.tiny_models.lora_fixtures import QWEN_EDIT_LIGHTNING, QWEN_LIGHTNING

EDIT_FILES = [
    ("Qwen-Image-Edit-Lightning-4steps-V1.0.safetensors", 4),
    ("Qwen-Image-Edit-2509-Lightning-4steps-V1.0-bf16.safetensors", 4),
    ("Qwen-Image-Edit-2509-Lightning-8steps-V1.0-bf16.safetensors", 8),
    ("Qwen-Image-Edit-2511-Lightning-4steps-V1.0-fp32.safetensors", 4),
    ("Qwen-Image-Edit-2511-Lightning-4steps-V1.0-bf16.safetensors", 4),
]


@pytest.mark.parametrize("name, steps", EDIT_FILES)
def test_edit_lightning_names_declare_steps_shift_3_and_cfg_1(name, steps):
    contract = contracts.declared_contract(f"Qwen-Image-Edit-2509/{name}", {}, 64)
    assert (contract.steps, contract.shift, contract.cfg, contract.kind) == (steps, 3.0, 1.0, "distill")
    assert contract.sigmas == tuple(shifted_sigmas(steps, 3.0)) and contract.source == name
    assert contracts.lightning_task(name) == "image-editing"


def test_metadata_wins_over_an_edit_files_name():
    contract = contracts.declared_contract(EDIT_FILES[0][0], {"sampling_contract": "steps=6"}, None)
    assert (contract.steps, contract.shift, contract.declared_by) == (6, None, "metadata")  # shift left out: open


def _attach(load_tiny, tiny_models_root, model_name, lora):
    from lorabind.usecases.adapters import attach_fuse

    handle = ModelHandle(load_tiny(model_name))
    return attach_fuse(handle, lora, str(tiny_models_root / "loras" / lora), 1.0, where="node 3").handle


def test_the_edit_lightning_contract_is_enforced_and_20_steps_are_refused_by_name(load_tiny, tiny_models_root):
    handle = _attach(load_tiny, tiny_models_root, "tiny-qwen-image-edit-plus", QWEN_EDIT_LIGHTNING)
    resolved = resolve_schedule(handle, None, None, SamplingRequest(steps=4, cfg=1.0, shift=3.0))
    assert resolved.sigmas == pytest.approx((1.0, 0.9, 0.75, 0.5, 0.0))
    file_name = "Qwen-Image-Edit-2511-Lightning-4steps-V1.0-bf16.safetensors"
    assert [c.source for c in resolved.contracts] == [file_name]
    with pytest.raises(ContractError, match=rf"{file_name} is a 4-step distill LoRA: steps must be 4, got 20"):
        resolve_schedule(handle, None, None, SamplingRequest(steps=20, cfg=1.0, shift=3.0))
    overridden = resolve_schedule(handle, None, None,
                                  SamplingRequest(steps=20, cfg=1.0, shift=3.0, enforce_contract=False))
    assert overridden.steps == 20 and overridden.overrides


@pytest.mark.parametrize("model_name, lora, message", [
    ("tiny-qwen-image", QWEN_EDIT_LIGHTNING, "distilled on Qwen-Image-Edit, but tiny-qwen-image .* text-to-image"),
    ("tiny-qwen-image-edit-plus", QWEN_LIGHTNING, r"distilled on Qwen-Image \(text-to-image\), but .* image-editing"),
])
def test_a_lightning_file_of_the_other_task_is_refused_naming_both(load_tiny, tiny_models_root, model_name, lora,
                                                                  message):
    with pytest.raises(ContractError, match=message):
        _attach(load_tiny, tiny_models_root, model_name, lora)
