"""LoRA on GGUF-quantized layers (issue 27 part B): patches applied at dequantise time, the bytes never written.

The models are the tiny Wan2.2 experts of the factory with their Linear weights quantized to Q8_0 in memory
(``gguf_helpers``); the LoRAs are the factory's lightx2v pair. On the tiny config only the Linears whose rows
fit Q8_0's 32-value blocks are quantized (as published files keep such rows unquantized): the same model then
holds GGUF layers (patched at dequantise time) and ordinary ones (fused in place).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from engine_probes import gguf_patches_of, hooks_of_ours
from gguf_helpers import gguf_bytes, quantize_linears, reference_dequant
from lorabind.loaders.binding import dequant_patches
from lorabind.loaders.binding.bind import bind, binding_state, unbind
from lorabind.loaders.families.wan.slots import LOW_NOISE_EXPERT
from lorabind.loaders.handles import FuseSpec
from lorabind.loaders.lora import clear_lora_cache
from lorabind.loaders.models.store import LoadedModel
from lorabind.tiny_models.lora_fixtures import WAN22_HIGH, WAN22_LOW
from lorabind.tiny_models.wan import WAN22_NAME

# GGUF layers of the tiny expert -> (lightx2v module name, LoRA scale alpha/rank or 1 without alpha)
REFERENCE_NAMES = {
    "blocks.0.ffn.net.2": ("diffusion_model.blocks.0.ffn.2", 0.5 / 4),
    "blocks.1.ffn.net.2": ("diffusion_model.blocks.1.ffn.2", 0.5 / 4),
    "condition_embedder.text_embedder.linear_1": ("diffusion_model.text_embedding.0", 1.0),
}


@pytest.fixture(autouse=True)
def _fresh_reader_cache():
    clear_lora_cache()
    yield
    clear_lora_cache()


@pytest.fixture
def make_experts(tiny_models_root):
    """Factory: a fresh two-expert Wan2.2 LoadedModel from the tiny folder, Q8_0-quantized unless ``quantized``
    is False (the unquantized model the accounting is compared with)."""
    from diffusers import WanTransformer3DModel

    folder = tiny_models_root / "diffusers" / WAN22_NAME

    def make(quantized=True, compute_dtype=torch.float32):
        components = {}
        for name in ("transformer", LOW_NOISE_EXPERT):
            module = WanTransformer3DModel.from_pretrained(str(folder / name), torch_dtype=torch.float32).eval()
            if quantized:
                assert sorted(quantize_linears(module, compute_dtype=compute_dtype)) == sorted(REFERENCE_NAMES)
            components[name] = module
        return LoadedModel(path=str(folder), name=WAN22_NAME, family="wan2.2_moe", pipeline=None,
                           components=components, model_index=json.loads((folder / "model_index.json").read_text()))

    return make


def pair_specs(root: Path, high=1.0, low=1.0):
    return [FuseSpec(str(root / "loras" / WAN22_HIGH), high, "transformer"),
            FuseSpec(str(root / "loras" / WAN22_LOW), low, LOW_NOISE_EXPERT)]


def module_of(model, component, path):
    return model.components[component].get_submodule(path)


def test_bind_and_unbind_of_the_lightx2v_pair_leave_every_gguf_byte_identical(make_experts, tiny_models_root):
    model = make_experts()
    before = {c: gguf_bytes(m) for c, m in model.components.items()}
    state_before = {c: {k: v.clone() for k, v in m.state_dict().items()} for c, m in model.components.items()}
    assert all(len(b) == len(REFERENCE_NAMES) for b in before.values())

    report = bind(model, pair_specs(tiny_models_root), [])
    assert report.written > 2 * len(REFERENCE_NAMES)  # GGUF weights, and the ordinary params fused in place
    for component, module in model.components.items():
        after = gguf_bytes(module)
        assert [k for k in before[component] if not torch.equal(before[component][k], after[k])] == []
        for path in REFERENCE_NAMES:
            assert set(gguf_patches_of(module.get_submodule(path))) == {"weight"}
    # no GGUF weight keeps a backup: nothing of them is ever rewritten
    patcher = binding_state(model).patcher
    assert not any(pid.endswith(tuple(f"{p}.weight" for p in REFERENCE_NAMES)) for pid in patcher._originals)

    unbind(model)
    for component, module in model.components.items():
        state = module.state_dict()
        assert [k for k, v in state_before[component].items() if not torch.equal(v, state[k])] == []
        for path in REFERENCE_NAMES:
            layer = module.get_submodule(path)
            assert gguf_patches_of(layer) == {}
            assert list(hooks_of_ours(layer)) == []  # the hook went with the patches
            assert not hasattr(layer, "_diffusers_hook") and "forward" not in vars(layer)


@pytest.mark.parametrize("strength", [1.0, 0.37])
def test_patched_forward_equals_the_float64_reference(make_experts, tiny_models_root, strength):
    model = make_experts()
    bind(model, pair_specs(tiny_models_root, high=strength, low=strength), [])
    files = {"transformer": load_file(str(tiny_models_root / "loras" / WAN22_HIGH)),
             LOW_NOISE_EXPERT: load_file(str(tiny_models_root / "loras" / WAN22_LOW))}
    fresh = make_experts()  # the unbound model: the bias before its diff_b was fused
    generator = torch.Generator().manual_seed(5)
    for component, lora in files.items():
        for path, (native, scale) in REFERENCE_NAMES.items():
            layer = module_of(model, component, path)
            up, down = lora[f"{native}.lora_up.weight"].double(), lora[f"{native}.lora_down.weight"].double()
            weight = reference_dequant(layer.weight) + strength * scale * (up @ down)
            bias = module_of(fresh, component, path).bias.double() + strength * lora[f"{native}.diff_b"].double()
            x = torch.randn(3, layer.in_features, generator=generator, dtype=torch.float64)
            expected = x @ weight.T + bias
            with torch.no_grad():
                got = layer(x.float()).double()
            relative = (got - expected).abs().max() / expected.abs().max()
            assert relative <= 1e-5, f"{component}:{path}: relative error {relative:.2e}"
            assert type(layer.weight).__name__ == "GGUFParameter"  # the bytes are back after the forward


def test_accounting_and_unmatched_report_as_on_the_unquantized_model(make_experts, tiny_models_root):
    quantized, plain = make_experts(), make_experts(quantized=False)
    ours = bind(quantized, pair_specs(tiny_models_root), [])
    theirs = bind(plain, pair_specs(tiny_models_root), [])
    assert ours.fuses == theirs.fuses
    assert ours.fuses[0]["accounting"]["counts"]["applied"] > 0
    assert ours.written == theirs.written and ours.restored == theirs.restored == 0


def pair_slots(root: Path, swapped=False) -> list:
    names = (WAN22_LOW, WAN22_HIGH) if swapped else (WAN22_HIGH, WAN22_LOW)
    return [(f"{role}_noise_lora", name, str(root / "loras" / name), 1.0, component)
            for role, name, component in zip(("high", "low"), names, ("transformer", LOW_NOISE_EXPERT))]


def test_contracts_and_swap_detection_as_on_the_unquantized_model(make_experts, tiny_models_root):
    """The pair node's verb: the same accounting, the same declared 4-step contracts, the same refusal of a
    swapped pair on the GGUF experts as on the unquantized ones."""
    from lorabind.loaders.errors import KeyMatchError
    from lorabind.loaders.handles import ModelHandle
    from lorabind.usecases.adapters import attach_fuses

    attached = {}
    for quantized in (True, False):
        handle = ModelHandle(make_experts(quantized=quantized))
        attached[quantized] = attach_fuses(handle, pair_slots(tiny_models_root), where="node 1")
        with pytest.raises(KeyMatchError, match="the pair is swapped"):
            attach_fuses(handle, pair_slots(tiny_models_root, swapped=True), where="node 1")
    assert attached[True].contracts == attached[False].contracts and attached[True].contracts[0] is not None
    assert attached[True].accounting == attached[False].accounting
    assert attached[True].text == attached[False].text


def test_whole_expert_forward_matches_the_dequantised_model_fused(make_experts, tiny_models_root):
    """The GGUF model with patches computes what a dense model holding dequant(Q), fused in place, computes: the
    same float32 sums rounded once, so the patched weights are the same bits."""
    quantized, dense = make_experts(), make_experts(quantized=False)
    for component, module in dense.components.items():
        for path in REFERENCE_NAMES:
            with torch.no_grad():
                module.get_submodule(path).weight.copy_(reference_dequant(
                    module_of(quantized, component, path).weight).float())
    dense.path = "/nonexistent/dense-copy"  # its weights are not the folder's: every original is a RAM copy
    bind(quantized, pair_specs(tiny_models_root, 0.8, 0.6), [])
    bind(dense, pair_specs(tiny_models_root, 0.8, 0.6), [])
    for component in quantized.components:
        for path in REFERENCE_NAMES:
            patched = dequant_patches.patched_weight(module_of(quantized, component, path), "weight")
            assert torch.equal(patched, module_of(dense, component, path).weight)
    inputs = _expert_inputs()
    with torch.no_grad():
        got = quantized.components["transformer"](**inputs, return_dict=False)[0]
        expected = dense.components["transformer"](**inputs, return_dict=False)[0]
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)


def _expert_inputs():
    generator = torch.Generator().manual_seed(3)
    return {"hidden_states": torch.randn(1, 16, 1, 8, 8, generator=generator),
            "timestep": torch.tensor([500.0]),
            "encoder_hidden_states": torch.randn(1, 6, 32, generator=generator)}


def test_a_strength_change_rewrites_only_that_experts_layers(make_experts, tiny_models_root):
    model = make_experts()
    first = bind(model, pair_specs(tiny_models_root), [])
    low_layer = module_of(model, LOW_NOISE_EXPERT, "blocks.0.ffn.net.2")
    low_patch = gguf_patches_of(low_layer)["weight"]
    again = bind(model, pair_specs(tiny_models_root), [])
    assert (again.written, again.restored, again.unchanged) == (0, 0, first.written)
    changed = bind(model, pair_specs(tiny_models_root, high=0.5), [])
    assert changed.written == first.written // 2 and changed.unchanged == first.written - changed.written
    assert gguf_patches_of(low_layer)["weight"] is low_patch  # the other expert was not touched
    high_patch = gguf_patches_of(module_of(model, "transformer", "blocks.0.ffn.net.2"))["weight"]
    assert {c.strength for c in high_patch.contributions} == {0.5}


def test_an_interrupted_bind_leaves_no_patch_and_every_byte(make_experts, tiny_models_root):
    model = make_experts()
    before = {c: gguf_bytes(m) for c, m in model.components.items()}
    calls, patched_when_interrupted = [], []

    def interrupt_after_some_layers():
        calls.append(1)
        if len(calls) > 20:  # past the first expert's GGUF layers (the check below proves it), before the end
            patched_when_interrupted.extend(
                m for m in model.components["transformer"].modules() if gguf_patches_of(m))
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        bind(model, pair_specs(tiny_models_root), [], check_interrupt=interrupt_after_some_layers)
    assert patched_when_interrupted  # the roll-back below had GGUF patches to remove
    for component, module in model.components.items():
        assert all(torch.equal(v, gguf_bytes(module)[k]) for k, v in before[component].items())
        assert not any(gguf_patches_of(m) for m in module.modules())
    assert binding_state(model).patcher.patched == set()


def pairs_only(tiny_models_root, tmp_path) -> tuple:
    """(path, tensors) of the high-noise file's low-rank pairs alone: a file a dynamic (peft) adapter can run."""
    from safetensors.torch import save_file

    lora = load_file(str(tiny_models_root / "loras" / WAN22_HIGH))
    path = tmp_path / "wan22_pairs_only.safetensors"
    save_file({k: v for k, v in lora.items() if ".lora_" in k or k.endswith(".alpha")}, str(path))
    return path, lora


def test_a_dynamic_adapter_runs_unfused_over_gguf_layers(make_experts, tiny_models_root, tmp_path):
    """The peft path: the low-rank pairs of the high-noise file as an adapter; its output adds exactly
    ``scale · x·ΔWᵀ`` to the GGUF layer's own, and no byte changes."""
    from lorabind.loaders.handles import AdapterSpec

    path, lora = pairs_only(tiny_models_root, tmp_path)
    model = make_experts()
    module = model.components["transformer"]
    before = gguf_bytes(module)
    x = torch.randn(3, 32, generator=torch.Generator().manual_seed(9), dtype=torch.float64)
    with torch.no_grad():
        plain = {p: module.get_submodule(p)(x.float()).double() for p in REFERENCE_NAMES}
    report = bind(model, [], [AdapterSpec(str(path), 0.7, "transformer")])
    assert report.adapters[0]["accounting"]["counts"]["unmatched"] == 0
    for path_in_model, (native, scale) in REFERENCE_NAMES.items():
        up, down = lora[f"{native}.lora_up.weight"].double(), lora[f"{native}.lora_down.weight"].double()
        with torch.no_grad():
            got = module.get_submodule(path_in_model)(x.float()).double() - plain[path_in_model]
        expected = 0.7 * scale * x @ (up @ down).T
        assert (got - expected).abs().max() / expected.abs().max() <= 1e-5
    after = {k.replace(".base_layer.", "."): v for k, v in gguf_bytes(module).items()}  # peft wraps the layers
    assert sorted(after) == sorted(before) and all(torch.equal(before[k], after[k]) for k in before)


def test_the_patch_follows_the_bytes_the_layer_holds_when_it_runs(make_experts, tiny_models_root):
    """A memory plan may replace a parameter between forwards (a copy on another device): the patch is applied
    to whatever bytes the layer holds at its forward, and those bytes are what it holds afterwards."""
    from diffusers.quantizers.gguf.utils import GGUFParameter

    model = make_experts()
    bind(model, pair_specs(tiny_models_root), [])
    layer = module_of(model, "transformer", "blocks.0.ffn.net.2")
    x = torch.randn(2, 32, generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        first = layer(x)
        moved = GGUFParameter(gguf_bytes(layer)["weight"].clone(), quant_type=layer.weight.quant_type)
        layer._parameters["weight"] = moved
        second = layer(x)
    assert layer.weight is moved and torch.equal(first, second)


def test_adapter_weights_over_gguf_layers_take_the_compute_dtype(make_experts, tiny_models_root, tmp_path):
    """peft would leave them float32 over uint8 bytes; over a bf16-computing GGUF layer they are bf16, over the
    model's ordinary float32 layers they stay float32."""
    from lorabind.loaders.handles import AdapterSpec

    path, _ = pairs_only(tiny_models_root, tmp_path)
    model = make_experts(compute_dtype=torch.bfloat16)
    bind(model, [], [AdapterSpec(str(path), 1.0, "transformer")])
    module = model.components["transformer"]
    dtypes = {name: {p.dtype for p in layer.lora_A.parameters()} for name, layer in module.named_modules()
              if hasattr(layer, "lora_A") and len(layer.lora_A)}
    assert {name: dtypes[name] for name in REFERENCE_NAMES} == {name: {torch.bfloat16} for name in REFERENCE_NAMES}
    assert set().union(*(d for n, d in dtypes.items() if n not in REFERENCE_NAMES)) == {torch.float32}


def _kind_deltas(generator):
    """One delta of each adapter kind for a [48, 64] weight (DoRA over a low-rank inner delta)."""
    from lorabind.loaders.lora.kinds.dora import DoraDelta
    from lorabind.loaders.lora.kinds.full_diff import FullDiff
    from lorabind.loaders.lora.kinds.loha import LohaDelta
    from lorabind.loaders.lora.kinds.low_rank import LowRankDelta

    def rand(*shape):
        return torch.randn(*shape, generator=generator) * 0.1

    low_rank = LowRankDelta(down=rand(4, 64), up=rand(48, 4), alpha=2.0, scale=0.5)
    return {"low_rank": low_rank,
            "loha": LohaDelta(rand(48, 4), rand(4, 64), rand(48, 4), rand(4, 64), alpha=None, scale=1.0),
            "dora": DoraDelta(low_rank, torch.rand(48, 1, generator=generator) + 0.5, peft_axis=True),
            "full_diff": FullDiff(rand(48, 64))}


@pytest.mark.parametrize("quant", ["Q8_0", "Q4_0", "Q5_0"])
@pytest.mark.parametrize("kind", ["low_rank", "loha", "dora", "full_diff"])
def test_every_kind_patches_a_gguf_weight_as_it_fuses_its_dequantised_value(quant, kind):
    """Patched at dequantise time == fused in place into a float32 layer holding dequant(Q): the same kind rows
    summed in float32 over the same chunks, so the same bits; and dequant(Q) is the gguf package's value."""
    import gguf

    from lorabind.loaders import gguf_weights
    from lorabind.loaders.binding.patching import PatchLayer, WeightPatcher
    from lorabind.loaders.lora.canonical import TargetPatch

    generator = torch.Generator().manual_seed(11)
    quantized = torch.nn.Sequential(torch.nn.Linear(64, 48))
    quantize_linears(quantized, gguf.GGMLQuantizationType[quant])
    dense = torch.nn.Sequential(torch.nn.Linear(64, 48))
    reference = reference_dequant(quantized[0].weight)
    assert torch.equal(gguf_weights.dequantize(quantized[0].weight).double(), reference)
    with torch.no_grad():
        dense[0].weight.copy_(reference.float())
    delta = _kind_deltas(generator)[kind]
    target = TargetPatch(module="0", low_rank=None if kind == "full_diff" else delta,
                         param_diffs={"weight": delta.tensor} if kind == "full_diff" else {})
    before = gguf_bytes(quantized)
    for module in (quantized, dense):
        WeightPatcher({"m": module}).apply([PatchLayer("k", "m", 0.8, {"0": target})])
    assert torch.equal(dequant_patches.patched_weight(quantized[0], "weight"), dense[0].weight)
    assert torch.equal(gguf_bytes(quantized)["0.weight"], before["0.weight"])


def test_a_forward_holds_one_patched_layer_at_a_time(make_experts, tiny_models_root):
    """Memory: while a patched GGUF layer runs, it alone holds a dequantised weight; every other keeps its bytes
    (nothing dequantised is kept between layers or after the forward)."""
    model = make_experts()
    bind(model, pair_specs(tiny_models_root), [])
    module = model.components["transformer"]
    layers = [module.get_submodule(path) for path in REFERENCE_NAMES]
    dense_while_running = []

    def counting_dense(layer):
        def forward_native(inputs):
            dense_while_running.append(sum(type(other.weight).__name__ != "GGUFParameter" for other in layers))
            assert type(layer.weight).__name__ != "GGUFParameter"  # this one runs with its patched weight
            return type(layer).forward_native(layer, inputs)
        return forward_native

    for layer in layers:  # inside the layer's forward, within our hook: sees its swap
        layer.forward_native = counting_dense(layer)
    with torch.no_grad():
        module(**_expert_inputs(), return_dict=False)
    for layer in layers:
        del layer.forward_native
    assert dense_while_running == [1] * len(layers)
    assert all(type(layer.weight).__name__ == "GGUFParameter" for layer in layers)


def _quantized_layer_and_target(factor: float):
    """A Q8_0 layer computing in bf16 and a rank-4 LoRA whose factors are all ``factor`` (ΔW = 4·factor², exact)."""
    import gguf

    from lorabind.loaders.lora.canonical import LowRankDelta, TargetPatch

    layer = torch.nn.Sequential(torch.nn.Linear(64, 48))
    quantize_linears(layer, gguf.GGMLQuantizationType.Q8_0, compute_dtype=torch.bfloat16)
    delta = LowRankDelta(down=torch.full((4, 64), factor), up=torch.full((48, 4), factor), alpha=None, scale=1.0)
    return layer, TargetPatch(module="0", low_rank=delta)


def test_a_bind_the_deltas_prove_finite_dequantises_nothing(monkeypatch):
    """Speed (issue 47): an ordinary LoRA is proven finite from its factors, so binding it on a GGUF layer neither
    dequantises the weight nor computes its patched value (that was the GGUF bind's extra cost); the value the
    forward then uses is still exact."""
    from lorabind.loaders import gguf_weights
    from lorabind.loaders.binding.patching import PatchLayer, WeightPatcher

    layer, target = _quantized_layer_and_target(0.25)  # ΔW = 0.25: far inside bf16's range
    dequantised = []
    real = gguf_weights.dequantize
    monkeypatch.setattr(gguf_weights, "dequantize", lambda tensor: dequantised.append(1) or real(tensor))
    WeightPatcher({"m": layer}).apply([PatchLayer("k", "m", 1.0, {"0": target})])
    assert dequantised == []
    expected = (real(layer[0].weight) + 0.25).to(torch.bfloat16)  # summed in float32, rounded once
    assert torch.equal(dequant_patches.patched_weight(layer[0], "weight"), expected)


def test_a_delta_that_overflows_the_compute_dtype_is_still_refused_at_bind():
    from lorabind.loaders.binding.fused_rows import NonFiniteResultError
    from lorabind.loaders.binding.patching import PatchLayer, WeightPatcher

    layer, target = _quantized_layer_and_target(1e19)  # 4e38 per element: past bf16 (and float32)
    with pytest.raises(NonFiniteResultError):
        WeightPatcher({"m": layer}).apply([PatchLayer("k", "m", 1.0, {"0": target})])
    assert gguf_patches_of(layer[0]) in (None, {})
