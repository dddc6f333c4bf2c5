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
    """Any model load or text encode fails the test loudly (for this test only: the use-case facade, which
    imports ``encode_text`` by name, is imported first, so it keeps the real one for later tests)."""
    import lorabind.usecases.models as models
    import lorabind.usecases.verbs  # noqa: F401

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


def test_another_familys_lora_in_the_pair_is_refused_from_the_files_before_the_model_loads(
        tiny_models_root, tmp_path, capsys, no_model_load):
    """Issue 54: Qwen-Image Lightning in the Wan2.2 pair was refused only after the model had loaded and both
    prompts were encoded, with advice to go 'lenient', which would have dropped all of its keys."""
    qwen = "lorabind-tiny/Qwen-Image-Lightning-4steps-V1.0.safetensors"
    try:
        code = main(["run", str(WORKFLOWS.parent / "wan22_lightx2v_4step.json"), "--models", str(tiny_models_root),
                     "--output", str(tmp_path / "out"), "--set", f"5.high_noise_lora={qwen}"])
    finally:
        folder_paths.configure()
    captured = capsys.readouterr()
    assert code == 1 and "[1/8]" not in captured.out + captured.err  # nothing ran: no load, no encode
    assert (f"node 5 (WanMoELoRAPair) refused before any model was loaded: KeyMatchError: high_noise_lora: {qwen} "
            "is a qwen_image LoRA (its module names are that family's), not one for tiny-wan22-t2v, a "
            "wan2.1/wan2.2_moe model: none of its keys would apply. Choose a LoRA made for this model") in captured.err
    assert "lenient" not in captured.err and "low_noise_lora" not in captured.err  # the Wan file there is fine


def test_a_lora_of_the_models_own_family_or_switched_off_is_not_refused_early(tiny_models_root):
    from lorabind.loaders.io import json_limits
    from lorabind.runtime.commands.run import contract_refusals, load_node_classes
    from lorabind.runtime.workflow_format import to_api_prompt

    node_classes, names = load_node_classes()
    prompt, _ = to_api_prompt(json_limits.loads((WORKFLOWS.parent / "wan22_lightx2v_4step.json").read_text()),
                              node_classes, names)
    folder_paths.configure(models_root=str(tiny_models_root))
    try:
        assert contract_refusals(prompt, node_classes) == []  # the Wan2.2 pair on the Wan2.2 model
        prompt["5"]["inputs"]["low_noise_lora"] = "lorabind-tiny/Qwen-Image-Lightning-4steps-V1.0.safetensors"
        refused = {node: message for node, _, message in contract_refusals(prompt, node_classes)}
        # the pair node for the family; the sampler may also be refused for the Lightning file's own contract
        assert "not one for tiny-wan22-t2v" in refused["5"] and set(refused) <= {"5", "6"}
        prompt["5"]["inputs"]["low_noise_strength"] = 0.0  # off: it applies nothing, the node decides
        assert contract_refusals(prompt, node_classes) == []
    finally:
        folder_paths.configure()
