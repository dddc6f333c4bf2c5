"""Binding under every memory plan: fuses and adapters hold across offloads and swaps, switching and unbinding
restore the base weights bit-exactly, and the expert swap follows its policy (one expert at a time, the expert
that ends a run stays resident, a bind on a resident expert is written back to its host copy)."""

import dataclasses

import pytest
import torch

from engine_probes import load_count
from lorabind.loaders import families
from lorabind.loaders.binding.bind import bind, release_adapters, unbind
from lorabind.loaders.contract_types import ResolvedSchedule
from lorabind.loaders.dispatch.generation_steps import denoise, empty_latent, encode_text
from lorabind.loaders.handles import AdapterSpec, FuseSpec
from lorabind.loaders.models import store as model_store
from lorabind.loaders.placement import load_plan
from lorabind.tiny_models import lora_fixtures as F

PLANS = ["full", "swap_experts", "offload_model", "offload_blocks"]
SCHEDULE = ResolvedSchedule(sigmas=(1.0, 0.9375, 0.833333, 0.625, 0.0), cfg=1.0, shift=5.0, boundary=None, steps=4)


@pytest.fixture(scope="module")
def models_root(tiny_models_root):
    return tiny_models_root


def _load(root, name, memory):
    return model_store.load_model(root / "diffusers" / name, device="cpu", memory=memory)


def _sample(model):
    positive = encode_text(model, "a red fox")
    return denoise(model, positive, None, empty_latent(model, 16, 16, frames=1), SCHEDULE, seed=3).samples


def _weights(model) -> dict:
    """Every denoiser tensor as the model holds it now (a component kept in its file is brought up to read it),
    plus the host copies a staged component keeps."""
    out = {}
    for c, m in model.components.items():
        model.placement.activate(c)
        out.update({f"{c}:{k}": v.detach().clone() for k, v in m.state_dict().items()})
    for name, staged in model.placement.staged.items():
        for index, host in enumerate(staged.host.values()):
            out[f"{name}:host{index}"] = host.clone()
    return out


def _patch_sets(root, name):
    loras = root / "loras"
    if name == "tiny-wan22-t2v":
        fuses = lambda s: [FuseSpec(str(loras / F.WAN22_HIGH), s, "transformer"),  # noqa: E731
                           FuseSpec(str(loras / F.WAN22_LOW), s, "transformer_2")]
        return [(fuses(1.0), []), (fuses(0.5), [])]
    adapter = [AdapterSpec(str(loras / F.PEFT_FOLDER), 1.0)]
    distill = lambda s: [FuseSpec(str(loras / F.WAN21_DISTILL), s, "transformer")]  # noqa: E731
    return [(distill(1.0), adapter), (distill(0.5), [])]


@pytest.mark.slow
@pytest.mark.parametrize("name", ["tiny-wan22-t2v", "tiny-wan21-t2v"])
def test_bind_switch_unbind_under_every_plan_matches_full_and_restores_base_weights(name, models_root):
    results = {}
    for memory in PLANS:
        if memory == "swap_experts" and name != "tiny-wan22-t2v":
            continue
        model = _load(models_root, name, memory)
        unbind(model)
        base = _weights(model)
        run = [_sample(model)]
        for fuses, adapters in _patch_sets(models_root, name):  # bind, sample, switch, sample
            bind(model, fuses, adapters)
            run.append(_sample(model))
        unbind(model)
        release_adapters(model)  # unbind keeps injected adapters cached (inactive); this removes them
        run.append(_sample(model))
        after = _weights(model)
        assert after.keys() == base.keys()
        assert [k for k in base if not torch.equal(base[k], after[k])] == []
        results[memory] = run
    for memory, run in results.items():
        assert all(torch.equal(a, b) for a, b in zip(run, results["full"])), memory
    full = results["full"]
    assert not torch.equal(full[0], full[1]) and not torch.equal(full[1], full[2])  # the binds changed something
    assert torch.equal(full[0], full[3])  # unbound: the base model again


def test_adapter_layers_injected_under_block_offload_get_new_hooks(models_root):
    model = _load(models_root, "tiny-wan21-t2v", "offload_blocks")
    before = model.placement.stats.hooks_reapplied
    bind(model, [], [AdapterSpec(str(models_root / "loras" / F.PEFT_FOLDER), 1.0)])
    assert model.placement.stats.hooks_reapplied == before + 1  # the hooks now know the lora_A/lora_B tensors
    from diffusers.hooks.group_offloading import _is_group_offload_enabled

    assert _is_group_offload_enabled(model.components["transformer"])
    unbind(model)


@pytest.mark.slow
def test_expert_swap_one_at_a_time_resident_at_the_end_and_fuses_survive_the_file_round_trip(models_root, monkeypatch):
    plan_for = load_plan.choose_plan
    monkeypatch.setattr(load_plan, "choose_plan",
                        lambda *a, **k: dataclasses.replace(plan_for(*a, **k), prefetch=False))
    model_store.clear_cache()
    try:
        model = _load(models_root, "tiny-wan22-t2v", "swap_experts")
        placement = model.placement
        assert not placement.plan.prefetch
        _sample(model)
        assert placement.stats.uploads == {"text_encoder": 1, "transformer": 1, "transformer_2": 1}
        assert placement.stats.swaps == 1  # at the boundary
        assert placement.staged["transformer_2"].on_device and not placement.staged["transformer"].on_device
        assert not placement.staged["text_encoder"].on_device  # on the device only while encoding
        # bind while the low-noise expert is on the device: the experts are kept in their files (no host copy to
        # write back); the patcher keeps the fuse as patches and writes it again after every re-read
        assert placement.staged["transformer_2"].records and placement.staged["transformer"].records
        assert placement.staged["transformer"].module.proj_out.weight.is_meta  # in its file, not in RAM
        low = [FuseSpec(str(models_root / "loras" / F.WAN22_LOW), 1.0, "transformer_2")]
        bind(model, low, [])
        assert placement.stats.written_back == 0
        fused = _sample(model)
        assert placement.stats.swaps == 3  # back to the high-noise expert at the start, then the boundary
        unbind(model)
    finally:
        model_store.clear_cache()
    reference = _load(models_root, "tiny-wan22-t2v", "full")
    bind(reference, low, [])
    assert torch.equal(fused, _sample(reference))
    unbind(reference)


def test_a_plan_that_does_not_fit_is_refused_before_loading(models_root, monkeypatch):
    from lorabind.loaders.errors import ModelLoadError

    monkeypatch.setattr(load_plan, "free_memory", lambda device: (64 * 1024**2, None))
    folder = models_root / "diffusers" / "tiny-wan21-t2v"
    loads = load_count(folder)
    with pytest.raises(ModelLoadError) as info:
        model_store.load_model(folder, device="cpu", memory="offload_blocks", dtype="float16")
    message = str(info.value)
    assert message.startswith("tiny-wan21-t2v on cpu: ")
    assert "memory=offload_blocks needs" in message and "0.1 GiB free" in message
    assert message.endswith("Nothing was loaded.")
    assert load_count(folder) == loads


@pytest.mark.slow
def test_a_text_encoder_streamed_by_blocks_encodes_exactly_as_resident(models_root):
    """The planner streams a text encoder too large for the device even alone (umt5-xxl on 8 GiB); its layers sit
    one level down, so it is offloaded leaf by leaf (block level would make it one group)."""
    from diffusers.hooks.group_offloading import _is_group_offload_enabled

    from lorabind.loaders.placement.apply_plan import ModelPlacement

    full = _load(models_root, "tiny-wan21-t2v", "full")
    expected = encode_text(full, "a red fox").embeds
    model_store.clear_cache()
    try:
        model = _load(models_root, "tiny-wan21-t2v", "offload_model")
        plan = dataclasses.replace(model.placement.plan, placement={**model.placement.plan.placement,
                                                                    "text_encoder": "blocks"})
        encoder = model.pipeline.text_encoder
        model.placement.remove()
        model.placement = ModelPlacement(dict(model.pipeline.components), plan, torch.device("cpu"),
                                         families.component_roles(model.model_index))
        model.placement.apply()
        assert _is_group_offload_enabled(encoder)
        hooked = [m for m in encoder.modules() if getattr(m, "_diffusers_hook", None) is not None]
        assert len(hooked) > 10  # one group per leaf module, not one for the whole encoder
        assert torch.equal(encode_text(model, "a red fox").embeds, expected)
    finally:
        model_store.clear_cache()


@pytest.mark.slow
def test_offload_model_takes_the_denoiser_off_the_device_for_the_decode(models_root):
    """``on_demand`` denoisers are on the device only while denoising: the VAE decode (and the next encode) need
    the room. The decoder's forward starts the decode phase, whichever family code calls it."""
    from lorabind.loaders.handles import ModelHandle
    from lorabind.nodes.output_nodes import LoraBindVAEDecode

    model = _load(models_root, "tiny-wan21-t2v", "offload_model")
    uploads = model.placement.stats.uploads.get("transformer", 0)
    positive = encode_text(model, "a red fox")
    latent = denoise(model, positive, None, empty_latent(model, 16, 16, frames=1), SCHEDULE, seed=3)
    assert model.placement.stats.uploads["transformer"] == uploads + 1
    assert not model.placement.staged["text_encoder"].on_device  # encoders leave right after encoding
    LoraBindVAEDecode().decode(ModelHandle(model), latent)
    assert not model.placement.staged["transformer"].on_device
