"""One hook system (``loaders.forward_hooks``): fp8 compute, GGUF patches and placement all hook a model through
diffusers' registry, and removing them through it leaves the model byte-identical and hook-free."""

from __future__ import annotations

import json

import pytest
import torch

from engine_probes import detach_all, gguf_patches_of, hooks_of_ours
from gguf_helpers import quantize_linears
from lorabind.loaders import families, forward_hooks, fp8
from lorabind.loaders.binding.patching import PatchLayer, WeightPatcher
from lorabind.loaders.lora.canonical import LowRankDelta, TargetPatch
from lorabind.loaders.placement.apply_plan import ModelPlacement
from lorabind.loaders.placement.planner import MemoryPlan
from lorabind.tiny_models.wan import WAN21_NAME

FP8_LAYER = "blocks.0.attn1.to_q"  # a Linear the GGUF quantization leaves alone (its rows fit no Q8_0 block)
GGUF_LAYER = "blocks.0.ffn.net.2"


def _tiny_wan(tiny_models_root):
    """The tiny Wan2.1 transformer with GGUF Linears and one fp8-stored weight, and its VAE and model index."""
    from diffusers import AutoencoderKLWan, WanTransformer3DModel

    folder = tiny_models_root / "diffusers" / WAN21_NAME
    transformer = WanTransformer3DModel.from_pretrained(str(folder / "transformer"), torch_dtype=torch.float32)
    assert GGUF_LAYER in quantize_linears(transformer.eval())
    layer = transformer.get_submodule(FP8_LAYER)
    assert type(layer) is torch.nn.Linear
    stored, scale = fp8.quantize(layer.weight.detach(), scaled=True)
    layer.weight = torch.nn.Parameter(stored, requires_grad=False)  # the loaded model: fp8 bytes, no hook yet
    vae = AutoencoderKLWan.from_pretrained(str(folder / "vae"), torch_dtype=torch.float32).eval()
    return transformer, vae, json.loads((folder / "model_index.json").read_text()), scale


def _snapshot(*modules) -> list:
    return [{name: tensor.detach().clone() for name, tensor in module.state_dict().items()} for module in modules]


def _identical(before: dict, after: dict) -> bool:
    return before.keys() == after.keys() and all(
        before[k].dtype == after[k].dtype and torch.equal(before[k].view(torch.uint8), after[k].view(torch.uint8))
        for k in before)


def _apply_all_three(transformer, vae, model_index, scale) -> ModelPlacement:
    layer = transformer.get_submodule(FP8_LAYER)
    fp8.keep_fp8(layer, "weight", layer.weight.data, scale, torch.float32)
    generator = torch.Generator().manual_seed(3)
    out_features, in_features = transformer.get_submodule(GGUF_LAYER).weight.quant_shape
    delta = LowRankDelta(down=torch.randn(2, in_features, generator=generator) * 0.01,
                         up=torch.randn(out_features, 2, generator=generator) * 0.01, alpha=None, scale=1.0)
    WeightPatcher({"transformer": transformer}).apply(
        [PatchLayer("lora", "transformer", 1.0, {GGUF_LAYER: TargetPatch(module=GGUF_LAYER, low_rank=delta)})])
    plan = MemoryPlan(memory="offload_model", resident=("transformer",),
                      placement={"transformer": "on_demand", "vae": "device"})
    placement = ModelPlacement({"transformer": transformer, "vae": vae}, plan, torch.device("cpu"),
                               families.component_roles(model_index))
    placement.apply()
    return placement


def _run(transformer, vae) -> None:
    config = transformer.config
    with torch.no_grad():
        transformer(torch.randn(1, config.in_channels, 1, 4, 4), timestep=torch.tensor([500]),
                    encoder_hidden_states=torch.randn(1, 3, config.text_dim))
        vae.decode(torch.randn(1, vae.config.z_dim, 1, 2, 2))


def _hook_free(module) -> list:
    """What is left of any hook on ``module`` or below it (empty: nothing)."""
    left = []
    for name, sub in module.named_modules():
        if sub._forward_hooks or sub._forward_pre_hooks or hasattr(sub, "_diffusers_hook") or "forward" in vars(sub):
            left.append(name)
    return left


def test_every_hook_kind_is_in_the_one_registry_and_removing_them_leaves_the_model_as_loaded(tiny_models_root):
    transformer, vae, model_index, scale = _tiny_wan(tiny_models_root)
    before = _snapshot(transformer, vae)
    placement = _apply_all_three(transformer, vae, model_index, scale)

    _run(transformer, vae)
    assert placement.stats.uploads == {"transformer": 1}  # the placement hook ran
    assert gguf_patches_of(transformer.get_submodule(GGUF_LAYER))  # and the GGUF one is there
    kinds = {(name, hook) for name, _, hook in hooks_of_ours(transformer)} | \
        {("vae." + name, hook) for name, _, hook in hooks_of_ours(vae)}
    assert kinds == {(FP8_LAYER, forward_hooks.FP8_COMPUTE), (GGUF_LAYER, forward_hooks.GGUF_PATCHES),
                     ("", forward_hooks.PLACEMENT_STAGE), ("vae.decoder", forward_hooks.PLACEMENT_DECODE)}
    # after the forwards every swapped weight is back: the model holds its stored bytes between forwards
    assert all(_identical(b, a) for b, a in zip(before, _snapshot(transformer, vae)))

    assert detach_all(transformer) + detach_all(vae) == 4
    assert _hook_free(transformer) == [] and _hook_free(vae) == []
    assert all(_identical(b, a) for b, a in zip(before, _snapshot(transformer, vae)))
    assert fp8.stored_weights(transformer) == {} and gguf_patches_of(
        transformer.get_submodule(GGUF_LAYER)) == {}


def test_a_hook_that_swaps_a_weight_puts_it_back_when_the_forward_raises():
    """As torch's ``always_call`` did: an fp8 layer whose forward fails still holds its fp8 bytes after it."""
    layer = torch.nn.Linear(4, 4)
    stored, scale = fp8.quantize(layer.weight.detach(), scaled=True)
    fp8.keep_fp8(layer, "weight", stored, scale, torch.float32)
    with pytest.raises(RuntimeError):
        layer(torch.ones(2, 5))  # a shape the matmul refuses, inside the hooked forward
    assert layer._parameters["weight"] is fp8.stored_weight(layer, "weight").stored
    assert torch.equal(layer.weight.data.view(torch.uint8), stored.view(torch.uint8))


def test_detach_keeps_a_registry_that_holds_another_hook():
    """Removing ours leaves diffusers' own hooks (group offload's, on the same module) and their forward."""
    from diffusers.hooks.hooks import HookRegistry, ModelHook

    layer = torch.nn.Linear(4, 4)
    forward_hooks.attach(layer, forward_hooks.PLACEMENT_STAGE)
    HookRegistry.check_if_exists_or_initialize(layer).register_hook(ModelHook(), "someone_else")
    forward_hooks.detach(layer, forward_hooks.PLACEMENT_STAGE)
    assert list(layer._diffusers_hook.hooks) == ["someone_else"] and "forward" in vars(layer)
    assert torch.equal(layer(torch.ones(1, 4)), torch.nn.functional.linear(torch.ones(1, 4), layer.weight, layer.bias))


def test_a_second_hook_of_ours_on_one_module_is_refused():
    """diffusers' ``remove_hook`` cannot take a hook out from under one of ours: one per module, checked."""
    layer = torch.nn.Linear(4, 4)
    forward_hooks.attach(layer, forward_hooks.PLACEMENT_STAGE)
    with pytest.raises(ValueError, match="already has the hook lorabind.placement_stage; one lorabind hook"):
        forward_hooks.attach(layer, forward_hooks.GGUF_PATCHES)
    assert [name for _, _, name in hooks_of_ours(layer)] == [forward_hooks.PLACEMENT_STAGE]
