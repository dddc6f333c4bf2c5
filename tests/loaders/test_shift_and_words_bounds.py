"""Issue 61 item 5: a flow shift no schedule can be built with is refused by name, never a "division by zero" (a
request's shift 0 or 1e-300, a contract table entry's ``shift=1e-300``), and a 10 MB contract string is quoted in
a bounded refusal, not echoed whole."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file

from lorabind.loaders.contract_types import MIN_SHIFT
from lorabind.loaders.contracts.sigmas import shift_schedule, shifted_sigmas
from lorabind.loaders.contracts.table import TABLE_NAME
from lorabind.loaders.dispatch.contract_discovery import SamplingRequest, discover_contract, resolve_schedule
from lorabind.loaders.errors import ContractError
from lorabind.loaders.handles import ModelHandle

TEN_MB = 10 * 1024 * 1024
BOUND = 1000  # a refusal quoting 10 MB of words stays under this many characters


def _lora(folder, name="my_wan_lora.safetensors", metadata=None):
    tensors = {"diffusion_model.blocks.0.self_attn.q.lora_down.weight": torch.ones(4, 8),
               "diffusion_model.blocks.0.self_attn.q.lora_up.weight": torch.ones(8, 4)}
    path = folder / name
    save_file(tensors, str(path), metadata=metadata)
    return path


def _wan_handle():
    from types import SimpleNamespace

    return ModelHandle(model=SimpleNamespace(family="wan2.1", name="tiny", model_index={}))


@pytest.mark.parametrize("shift", [0.0, 1e-300, -2.0, float("nan"), 10 ** 400])
def test_a_request_shift_no_schedule_can_use_is_refused_by_name(shift):
    with pytest.raises(ValueError, match=rf"^shift must be a finite number of at least {MIN_SHIFT:g} \(the "
                                         r"flow-matching time shift\), got "):
        resolve_schedule(_wan_handle(), None, None, SamplingRequest(steps=4, cfg=1.0, shift=shift))


def test_the_smallest_shift_still_builds_a_decreasing_schedule():
    sigmas = shifted_sigmas(4, MIN_SHIFT)
    assert sigmas[0] == pytest.approx(1.0) and sigmas[-1] == 0.0 and all(b < a for a, b in zip(sigmas, sigmas[1:]))
    with pytest.raises(ValueError, match="shift must be"):
        shift_schedule([1.0, 0.5, 0.0], 0.0)


@pytest.mark.parametrize("where", ["metadata", "table"])
def test_a_contract_declaring_a_vanishing_shift_is_refused_naming_where(tmp_path, where):
    words = "steps=4, shift=1e-300"
    if where == "metadata":
        path = _lora(tmp_path, metadata={"sampling_contract": words})
        named = "my_wan_lora.safetensors: safetensors metadata sampling_contract='steps=4, shift=1e-300'"
    else:
        path = _lora(tmp_path)
        (tmp_path / TABLE_NAME).write_text(json.dumps({"my_wan_lora.safetensors": words}), encoding="utf-8")
        named = f"{TABLE_NAME} line 1: the contract 'steps=4, shift=1e-300' for my_wan_lora.safetensors"
    with pytest.raises(ContractError) as caught:
        discover_contract(str(path))
    assert str(caught.value).startswith(f"{named} is malformed (")
    assert f"shift at least {MIN_SHIFT:g}" in str(caught.value)


@pytest.mark.parametrize("words", ["x" * TEN_MB, "steps=4, shift=" + "y" * TEN_MB, "steps=4, tasks=" + "!" * TEN_MB,
                                   "steps=4, cfg=" + "9" * TEN_MB])
def test_a_ten_megabyte_contract_string_gives_a_bounded_refusal(tmp_path, words):
    path = _lora(tmp_path, metadata={"sampling_contract": words})
    with pytest.raises(ContractError) as caught:
        discover_contract(str(path))
    message = str(caught.value)
    assert len(message) < BOUND, len(message)
    assert message.startswith("my_wan_lora.safetensors: safetensors metadata sampling_contract=")
    assert f"({len(words)} characters)" in message and "is malformed" in message
