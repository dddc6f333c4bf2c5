"""GGUF denoisers through LoraBindCheckpointLoader: quantized Linear weights stay quantized (diffusers'
``GGUFLinear`` / ``GGUFParameter``), the rest loads exactly as from the bf16 single file, the run stays within a
stated tolerance of the bf16 run, and a hostile file leaves nothing loaded."""

import gguf
import pytest
import torch
from diffusers.quantizers.gguf.utils import GGUFLinear, GGUFParameter, dequantize_gguf_tensor

from lorabind.loaders.errors import ModelLoadError
from lorabind.loaders.io.gguf_header import read_gguf_header
from single_file_helpers import call, render

TINY = "lorabind-tiny/"
SETS = {
    "wan": (("wan2.2_t2v_high_noise_tiny", "wan2.2_t2v_low_noise_tiny"), "wan_2.1_vae_tiny.safetensors",
            "umt5_tiny_bf16.safetensors", 5),
    "qwen_image": (("qwen_image_tiny",), "qwen_image_vae_tiny.safetensors", "qwen_2.5_vl_tiny_bf16.safetensors", 1),
}


@pytest.fixture
def models_root(single_file_root, registry_at):
    registry_at(single_file_root)
    return single_file_root


def _load(case: str, suffix: str, memory: str = "full"):
    stems, vae, encoder, _ = SETS[case]
    names = [f"{TINY}{stem}_{suffix}" for stem in stems]
    model, detected = call("LoraBindCheckpointLoader", denoiser=names[0],
                           denoiser_low_noise=names[1] if len(names) > 1 else "none", vae=f"{TINY}{vae}",
                           text_encoder=f"{TINY}{encoder}", dtype="bfloat16", device="cpu", memory=memory)
    return model, detected


def _quantized_linears(model):
    return {(component, name): module for component, denoiser in model.model.components.items()
            for name, module in denoiser.named_modules() if isinstance(module, GGUFLinear)}


@pytest.mark.parametrize("case", SETS)
def test_quantized_linears_hold_the_file_blocks_and_dequantise_like_the_gguf_package(models_root, case):
    model, detected = _load(case, "Q8_0.gguf")
    assert "(GGUF Q8_0)" in detected
    stems = SETS[case][0]
    headers = [read_gguf_header(models_root / "diffusion_models" / TINY / f"{stem}_Q8_0.gguf") for stem in stems]
    quantized_in_files = sum(t.quantized for header in headers for t in header.tensors.values())
    linears = _quantized_linears(model)
    assert len(linears) == quantized_in_files > 0  # every quantized tensor of the tiny files is a Linear weight
    for (component, name), module in linears.items():
        weight = module.weight
        assert isinstance(weight, GGUFParameter) and weight.dtype == torch.uint8  # never dequantised in memory
        assert weight.quant_type == gguf.GGMLQuantizationType.Q8_0
        reference = torch.from_numpy(gguf.quants.dequantize(weight.as_tensor().numpy(), weight.quant_type))
        # diffusers multiplies the fp16 scale by the int8 values in fp16: one fp16 rounding (2**-11 relative)
        torch.testing.assert_close(dequantize_gguf_tensor(weight).float(), reference, rtol=2.0 ** -11, atol=0)
        x = torch.randn(3, module.in_features, dtype=torch.bfloat16, generator=torch.Generator().manual_seed(0))
        expected = torch.nn.functional.linear(x, dequantize_gguf_tensor(weight).to(torch.bfloat16), module.bias)
        assert torch.equal(module(x), expected), (component, name)  # the per-forward path is exactly that


def _dequantised_bf16_set(case: str):
    """The bf16 set with each weight the GGUF file quantizes replaced by the values GGUFLinear computes with."""
    reference, _ = _load(case, "bf16.safetensors")
    gguf_model, _ = _load(case, "Q8_0.gguf")
    patched = {}
    for (component, name), module in _quantized_linears(gguf_model).items():
        linear = reference.model.components[component].get_submodule(name)
        patched[(component, name)] = linear.weight.data.clone()
        linear.weight.data = dequantize_gguf_tensor(module.weight).to(torch.bfloat16)
    return reference, gguf_model, patched


@pytest.mark.slow
@pytest.mark.parametrize("case", SETS)
def test_gguf_run_is_the_bf16_run_with_dequantised_weights_and_within_tolerance(models_root, case):
    """Two claims. Exact: the Q8_0 run equals, bit for bit, the bf16 set's run with the quantized weights swapped
    for their dequantised values; so everything else (F32/BF16 tensors, layout, expert pairing) loads exactly as
    the bf16 file does, and the only difference between the two runs is the quantization error the fixture test
    bounds tensor by tensor. Tolerance: the random tiny models amplify any weight change (a few bf16 ulps in two
    matrices moves the 3-step image by ~0.003 on average), so the yardstick is the fp8_e4m3fn run of the same
    set, the lossy format the project already ships: Q8_0 rounds a weight by at most 0.56/127 of its block's
    largest value, fp8_e4m3fn by up to 2**-4 of itself, so the Q8_0 run must be no further from the bf16 run
    than twice the fp8 run is (mean absolute difference of the decoded frames)."""
    frames = SETS[case][3]
    baseline = render(_load(case, "bf16.safetensors")[0], frames=frames)
    reference, gguf_model, originals = _dequantised_bf16_set(case)
    try:
        assert torch.equal(render(gguf_model, frames=frames), render(reference, frames=frames))
    finally:
        for (component, name), weight in originals.items():  # the shared cached bf16 model, as it was
            reference.model.components[component].get_submodule(name).weight.data = weight
    quantized = render(gguf_model, frames=frames)
    fp8 = render(_load(case, "fp8_e4m3fn.safetensors")[0], frames=frames)
    assert bool(torch.isfinite(quantized).all())
    q8_distance = (quantized - baseline).abs().mean().item()
    fp8_distance = (fp8 - baseline).abs().mean().item()
    assert 0 < q8_distance <= 2 * fp8_distance, (q8_distance, fp8_distance)


def test_hostile_gguf_denoiser_is_refused_by_name_and_nothing_is_loaded(models_root):
    from lorabind.loaders.models import store

    source = models_root / "diffusion_models" / TINY / "wan2.2_t2v_high_noise_tiny_Q8_0.gguf"
    broken = models_root / "diffusion_models" / "broken_high_noise_Q8_0.gguf"
    data = source.read_bytes()
    broken.write_bytes(data[: len(data) - 4096])  # truncated inside the last tensors
    before = len(store.loaded_models())
    try:
        with pytest.raises(ModelLoadError) as caught:
            call("LoraBindCheckpointLoader", denoiser="broken_high_noise_Q8_0.gguf",
                 denoiser_low_noise=f"{TINY}wan2.2_t2v_low_noise_tiny_Q8_0.gguf",
                 vae=f"{TINY}wan_2.1_vae_tiny.safetensors", text_encoder=f"{TINY}umt5_tiny_bf16.safetensors",
                 dtype="bfloat16", device="cpu", memory="full")
    finally:
        broken.unlink()
    assert str(caught.value).startswith("broken_high_noise_Q8_0.gguf: ") and "truncated" in str(caught.value)
    assert len(store.loaded_models()) == before


def test_planned_bytes_are_what_loading_holds_gguf_at_its_quantized_bytes(models_root):
    """The plan sizes a GGUF denoiser as loaded: the quantized Linear weights at their blocks' bytes, the rest at
    the compute dtype (float32 in the modules the class keeps so); only the header is read to know which."""
    from lorabind.loaders.models.single_file.gguf_loading import load_gguf_component
    from lorabind.loaders.models.single_file.pipelines import SingleFileSet, detect_set

    def named(folder, name):
        return str(models_root / folder / "lorabind-tiny" / name), name

    files = detect_set([named("diffusion_models", f"wan2.2_t2v_{e}_noise_tiny_Q8_0.gguf") for e in ("high", "low")],
                       named("vae", "wan_2.1_vae_tiny.safetensors"), named("text_encoders", "umt5_tiny_bf16.safetensors"))
    source = SingleFileSet(files)
    planned = {size.name: size.bytes for size in source.component_sizes(torch.bfloat16)}
    for name, detected in source.named.items():
        if detected.is_gguf:
            module = load_gguf_component(detected, dtype=torch.bfloat16)
            held = sum(t.nbytes for t in module.parameters()) + sum(t.nbytes for t in module.buffers())
            assert planned[name] == held, name


@pytest.mark.slow
def test_every_memory_plan_renders_a_gguf_set_bit_identical_to_full(models_root):
    """Staging, swapping and group offload move the quantized weights as they are (``GGUFParameter`` kept)."""
    reference = render(_load("wan", "Q8_0.gguf")[0], frames=5)
    for memory in ("swap_experts", "offload_model", "offload_blocks"):
        model, _ = _load("wan", "Q8_0.gguf", memory=memory)
        assert model.model.placement.plan.memory == memory
        assert torch.equal(render(model, frames=5), reference), memory
        assert all(isinstance(module.weight, GGUFParameter) for module in _quantized_linears(model).values())
