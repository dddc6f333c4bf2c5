"""The lightx2v pair on the tiny GGUF experts as LoraBindCheckpointLoader loads them (issue 27 part B): the pair
is applied when each quantized layer dequantises, so bind and unbind leave every GGUF byte as it was loaded (the
file's blocks: test_single_file_gguf_loading), and a patched layer computes ``x·(dequant(Q) + s·ΔW)ᵀ + b``. The
example ``wan22_gguf_lightx2v`` runs in ``lorabind run`` and ``serve`` in test_workflow_outputs."""

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import lorabind
from engine_probes import gguf_patches_of
from gguf_helpers import gguf_bytes, reference_dequant
from lorabind.loaders.binding import bind as binding
from lorabind.loaders.families.wan.slots import LOW_NOISE_EXPERT
from lorabind.loaders.handles import FuseSpec
from lorabind.tiny_models.lora_fixtures import FIXTURE_ALPHA, FIXTURE_RANK, QWEN_LIGHTNING, WAN22_HIGH, WAN22_LOW
from single_file_helpers import call

TINY = "lorabind-tiny/"
WORKFLOWS = Path(lorabind.__file__).parent / "workflows" / "api"
TEMPLATES = Path(lorabind.__file__).parent / "workflows"
LORAS = {"transformer": WAN22_HIGH, LOW_NOISE_EXPERT: WAN22_LOW}


@pytest.fixture
def root(single_file_root, registry_at):
    registry_at(single_file_root)
    return single_file_root


def _experts(suffix: str):
    """The tiny Wan2.2 set with its experts from ``wan2.2_t2v_{high,low}_noise_tiny_<suffix>``, in float32."""
    model, _ = call("LoraBindCheckpointLoader", denoiser=f"{TINY}wan2.2_t2v_high_noise_tiny_{suffix}",
                    denoiser_low_noise=f"{TINY}wan2.2_t2v_low_noise_tiny_{suffix}",
                    vae=f"{TINY}wan_2.1_vae_tiny.safetensors", text_encoder=f"{TINY}umt5_tiny_bf16.safetensors",
                    dtype="float32", device="cpu", memory="full")
    return model.model


def _fuses(root, strength=1.0):
    return [FuseSpec(str(root / "loras" / name), strength, component) for component, name in LORAS.items()]


def _all_bytes(model) -> dict:
    return {(c, k): v for c, m in model.components.items() for k, v in gguf_bytes(m).items()}


@pytest.mark.parametrize("quant", ["Q8_0", "Q4_0"])
def test_bind_and_unbind_of_the_pair_leave_every_gguf_byte_and_patch_each_quantized_layer(root, quant):
    model = _experts(f"{quant}.gguf")
    before = _all_bytes(model)
    assert {c for c, _ in before} == set(LORAS) and len(before) >= 4
    try:
        report = binding.bind(model, _fuses(root, 0.8), [])
        assert report.written > len(before)  # the GGUF layers and the ordinary parameters fused in place
        after = _all_bytes(model)
        assert after.keys() == before.keys() and all(torch.equal(before[k], after[k]) for k in before)
        for component, name in before:
            layer = model.components[component].get_submodule(name.rsplit(".", 1)[0])
            assert set(gguf_patches_of(layer)) == {"weight"}, (component, name)
        _check_patched_forwards(root, model, 0.8)
    finally:
        binding.unbind(model)
    after = _all_bytes(model)
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert not any(gguf_patches_of(m) for d in model.components.values() for m in d.modules())


def _check_patched_forwards(root, model, strength):
    """Each GGUF layer (``blocks.N.ffn.net.2``, the file's ``blocks.N.ffn.2``) against float64."""
    scale = FIXTURE_ALPHA / FIXTURE_RANK
    for component, file_name in LORAS.items():
        lora = load_file(str(root / "loras" / file_name))
        for name in gguf_bytes(model.components[component]):
            path = name.rsplit(".", 1)[0]
            native = "diffusion_model." + path.replace("ffn.net.2", "ffn.2")
            layer = model.components[component].get_submodule(path)
            up, down = lora[f"{native}.lora_up.weight"].double(), lora[f"{native}.lora_down.weight"].double()
            weight = reference_dequant(layer.weight) + strength * scale * (up @ down)
            x = torch.randn(3, layer.in_features, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
            with torch.no_grad():
                got = layer(x.float()).double()
            expected = x @ weight.T + layer.bias.double()  # the bias is an ordinary parameter, fused in place
            assert ((got - expected).abs().max() / expected.abs().max()).item() <= 1e-5, (component, path)


def test_lightning_on_the_qwen_image_gguf_keeps_its_bytes(root):
    """The other GGUF family: Qwen-Image Q8_0 with the Lightning fixture, every key applied, bytes kept."""
    model, _ = call("LoraBindCheckpointLoader", denoiser=f"{TINY}qwen_image_tiny_Q8_0.gguf", denoiser_low_noise="none",
                    vae=f"{TINY}qwen_image_vae_tiny.safetensors",
                    text_encoder=f"{TINY}qwen_2.5_vl_tiny_bf16.safetensors", dtype="float32", device="cpu",
                    memory="full")
    model = model.model
    before = _all_bytes(model)
    assert len(before) > 0
    try:
        report = binding.bind(model, [FuseSpec(str(root / "loras" / QWEN_LIGHTNING), 1.0, "transformer")], [])
        assert report.fuses[0]["accounting"]["counts"]["unmatched"] == 0
        after = _all_bytes(model)
        assert all(torch.equal(before[k], after[k]) for k in before)
        patched = [n for _, n in before if gguf_patches_of(
            model.components["transformer"].get_submodule(n.rsplit(".", 1)[0]))]
        assert patched and len(patched) == len(before)
    finally:
        binding.unbind(model)


def test_accounting_is_the_bf16_single_files(root):
    reports = {}
    for suffix in ("Q8_0.gguf", "bf16.safetensors"):
        model = _experts(suffix)
        try:
            reports[suffix] = binding.bind(model, _fuses(root), []).fuses
        finally:
            binding.unbind(model)
    assert reports["Q8_0.gguf"] == reports["bf16.safetensors"]
    assert all(fuse["accounting"]["counts"]["unmatched"] == 0 for fuse in reports["Q8_0.gguf"])


EXAMPLE = "wan22_gguf_lightx2v"


def test_the_examples_ui_form_converts_to_its_api_form(root):
    from lorabind.nodes import NODE_CLASS_MAPPINGS
    from lorabind.runtime.workflow_format import to_api_prompt

    ui = json.loads((TEMPLATES / f"{EXAMPLE}.json").read_text())
    converted, detected = to_api_prompt(ui, NODE_CLASS_MAPPINGS)
    api = json.loads((WORKFLOWS / f"{EXAMPLE}.api.json").read_text())
    assert detected == "ui"
    assert {k: (v["class_type"], v["inputs"]) for k, v in converted.items()} == {
        k: (v["class_type"], v["inputs"]) for k, v in api.items()}
    assert api["1"]["inputs"]["denoiser"].endswith("_Q8_0.gguf") and api["6"]["inputs"]["enforce_contract"] is True


def test_the_example_is_refused_before_loading_when_its_steps_break_the_pairs_contract(root, tmp_path, capsys):
    """``lorabind run`` checks the pair's declared 4-step contract before any model is loaded."""
    from lorabind.runtime.cli import main

    code = main(["run", str(WORKFLOWS / f"{EXAMPLE}.api.json"), "--models", str(root), "--output",
                 str(tmp_path / "out"), "--input", str(tmp_path / "input"), "--set", "6.steps=20"])
    err = capsys.readouterr().err
    assert code == 1 and "refused before any model was loaded" in err
    assert "is a 4-step distill LoRA: steps must be 4, got 20" in err and "[1/8]" not in err
