"""`lorabind run` refuses a prompt whose files' contracts contradict the sampler before any model is loaded or any
text encoded (issue 26: on a real 14B model the sampler would say so minutes later)."""

from __future__ import annotations

from pathlib import Path

import pytest

import lorabind
from lorabind.runtime import folder_paths
from lorabind.runtime.cli import main

WORKFLOWS = Path(lorabind.__file__).parent / "workflows" / "api"
TEMPLATES = Path(lorabind.__file__).parent / "workflows"


@pytest.fixture
def no_model_load(monkeypatch):
    """Any model load or text encode fails the test loudly."""
    import lorabind.usecases.models as models

    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded before the contract check")

    monkeypatch.setattr(models, "load_folder", refuse)
    monkeypatch.setattr("lorabind.loaders.dispatch.generation_steps.encode_text", refuse)


def _run(models_root, tmp_path, *extra):
    try:
        return main(["run", str(TEMPLATES / "wan22_mismatched_contract.json"), "--models", str(models_root),
                     "--output", str(tmp_path / "out"), *extra])
    finally:
        folder_paths.configure()


def test_mismatched_contract_is_refused_before_the_model_loads(tiny_models_root, tmp_path, capsys, no_model_load):
    assert _run(tiny_models_root, tmp_path) == 1
    captured = capsys.readouterr()
    assert "[1/8]" not in captured.out + captured.err  # no node ran: no load, no encode
    assert ("node 6 (LoraBindSampler) refused before any model was loaded: ContractError: "
            "wan2.2_t2v_A14b_high_noise_lora_rank64_lightx2v_4step_1217.safetensors is a 4-step distill LoRA: "
            "steps must be 4, got 20 (its file name declares this contract; set enforce_contract off to override "
            "it explicitly)") in captured.err
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").rglob("*.webp"))


@pytest.mark.parametrize("override", ["6.steps=4", "6.enforce_contract=off", "5.high_noise_strength=0"])
def test_a_prompt_the_sampler_would_accept_is_not_refused_early(tiny_models_root, override):
    from lorabind.loaders.io import json_limits
    from lorabind.runtime.commands.run import contract_refusals, load_node_classes
    from lorabind.runtime.workflow_format import to_api_prompt

    node_classes, names = load_node_classes()
    prompt, _ = to_api_prompt(json_limits.loads((TEMPLATES / "wan22_mismatched_contract.json").read_text()),
                              node_classes, names)
    node_id, _, rest = override.partition(".")
    name, _, value = rest.partition("=")
    prompt[node_id]["inputs"][name] = {"4": 4, "off": False, "0": 0.0}[value]
    folder_paths.configure(models_root=str(tiny_models_root))
    try:
        # a node with one of its files at strength 0 is left to the sampler (narrow on purpose: never refuse early
        # what the sampler might accept)
        assert contract_refusals(prompt, node_classes) == []
        prompt["6"]["inputs"]["steps"] = 20
        prompt["6"]["inputs"]["enforce_contract"] = True
        assert len(contract_refusals(prompt, node_classes)) == (0 if name == "high_noise_strength" else 1)
    finally:
        folder_paths.configure()
