"""The shipped real configurations measure to the published sizes, and the planner decides sensibly on them."""

import pytest

from lorabind.loaders.placement import component_sizes
from lorabind.loaders.placement.model_plan import plan_model
from lorabind.loaders.placement.planner import GIB

# Published figures (bf16): name -> {component: (parameters or None, bytes or None)}
PUBLISHED = {
    "wan2.1-t2v-1.3b": {"transformer": (None, 2.84e9), "text_encoder": (None, 11.4e9)},
    "wan2.1-t2v-14b": {"transformer": (14.3e9, 28.6e9)},
    "wan2.2-t2v-a14b": {"transformer": (14.3e9, 28.6e9), "transformer_2": (14.3e9, 28.6e9)},
    "wan2.2-i2v-a14b": {"transformer": (14.3e9, 28.6e9), "transformer_2": (14.3e9, 28.6e9)},
    "wan2.2-ti2v-5b": {"transformer": (None, 10.0e9)},
    "qwen-image": {"transformer": (20.4e9, 40.9e9), "text_encoder": (None, 16.6e9)},
    "minimax-h3": {"transformer": (None, 66e9), "text_encoder": (None, 67e9)},
}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_meta_built_sizes_match_the_published_ones(name):
    sizes = {s.name: s for s in component_sizes(name)}
    for component, (parameters, nbytes) in PUBLISHED[name].items():
        size = sizes[component]
        if parameters is not None:
            assert size.parameters == pytest.approx(parameters, rel=0.01), component
        assert size.bytes == pytest.approx(nbytes, rel=0.02), component


def _decide(name, gib, **kwargs):
    plan, _ = plan_model(name, vram_gib=gib, **kwargs)
    return plan


@pytest.mark.parametrize("name, gib, memory", [
    # everything (both experts, umt5, VAE: 64 GiB) stays resident with room for activations and the decode
    ("wan2.2-t2v-a14b", 141, "full"),
    ("wan2.2-t2v-a14b", 80, "full"),
    # both experts (53 GiB) do not fit next to activations; one expert at a time does
    ("wan2.2-t2v-a14b", 48, "swap_experts"),
    # one expert (26.7 GiB) does not fit: stream its blocks
    ("wan2.2-t2v-a14b", 24, "offload_blocks"),
    ("qwen-image", 80, "full"),
    ("qwen-image", 24, "offload_blocks"),
    # the 1.3B transformer fits easily, umt5-xxl (10.6 GiB) cannot be resident on 8 GiB
    ("wan2.1-t2v-1.3b", 8, "offload_model"),
])
def test_auto_decisions_at_real_sizes(name, gib, memory):
    plan = _decide(name, gib)
    assert (plan.memory, plan.fits) == (memory, True)
    assert plan.peak_device_bytes <= gib * GIB


def test_decisions_place_each_component():
    swap = _decide("wan2.2-t2v-a14b", 48)
    assert swap.placement == {"transformer": "swap", "transformer_2": "swap", "text_encoder": "on_demand",
                              "vae": "device"}
    small = _decide("wan2.1-t2v-1.3b", 8)
    assert small.placement["text_encoder"] == "blocks"  # 10.6 GiB cannot come to an 8 GiB device even alone
    assert small.vae_tiling is True  # a 720p decode (7.9 GiB) does not fit next to the rest


def test_minimax_reference_partition_is_not_counted_next_to_the_main_one():
    plan = _decide("minimax-h3", 141)
    assert (plan.memory, plan.placement["transformer_ref"]) == ("full", "host")
    assert "transformer_ref" not in plan.resident


def test_hopeless_case_refuses_with_needed_free_and_the_smallest_plan():
    plan = _decide("wan2.2-t2v-a14b", 4)
    assert plan.fits is False and plan.memory == "offload_blocks"
    assert f"needs {plan.peak_device_bytes / GIB:.1f} GiB of device memory (4.0 GiB free)" in plan.reason
    forced = _decide("wan2.2-t2v-a14b", 24, memory="full")
    assert forced.fits is False
    assert "(24.0 GiB free); memory=offload_blocks would fit" in forced.reason


def test_the_vace_real_configs_are_the_14b_transformer_plus_exactly_its_vace_branch():
    """Wan VACE 14B (and each Wan2.2 VACE Fun expert): the T2V 14B transformer plus 8 VACE blocks (a main block
    each, with its output projection; the first also with its input projection) and ``vace_patch_embedding``
    (96 control channels, 1x2x2 patches): 17.3B parameters, 34.7 GB in bf16."""
    import torch
    from diffusers.models.transformers.transformer_wan import WanTransformerBlock

    with torch.device("meta"):
        block = sum(p.numel() for p in WanTransformerBlock(5120, 13824, 40, "rms_norm_across_heads", True, 1e-6,
                                                          None).parameters())
    dim = 5120
    branch = 8 * block + 9 * (dim * dim + dim) + 96 * 2 * 2 * dim + dim
    t2v = {s.name: s for s in component_sizes("wan2.1-t2v-14b")}["transformer"].parameters
    for name, experts in (("wan2.1-vace-14b", ("transformer",)),
                          ("wan2.2-vace-fun-a14b", ("transformer", "transformer_2"))):
        sizes = {s.name: s for s in component_sizes(name)}
        assert [n for n in sizes if n.startswith("transformer")] == list(experts)
        for expert in experts:
            assert sizes[expert].parameters == t2v + branch
            assert sizes[expert].bytes == pytest.approx(34.7e9, rel=0.01)
