"""The memory planner's decisions on sizes shaped like the real models, and its refusals."""

import pytest

from lorabind.loaders.placement import ComponentSize, plan_memory
from lorabind.loaders.placement.planner import GIB, default_decode_bytes


def _component(name, role, total, blocks=0, block=0):
    return ComponentSize(name=name, role=role, bytes=int(total), largest_layer_bytes=int(total) // 100,
                         largest_block_bytes=int(block), blocks_bytes=int(blocks))


def _a14b_like():
    """Two 28.6 GB experts of 40 blocks, an 11.4 GB text encoder of 24 blocks, a 0.25 GB VAE."""
    return [
        _component("transformer", "high_noise_expert", 28.6e9, 40 * 0.7e9, 0.7e9),
        _component("transformer_2", "low_noise_expert", 28.6e9, 40 * 0.7e9, 0.7e9),
        _component("text_encoder", "text_encoder", 11.4e9, 24 * 0.4e9, 0.4e9),
        _component("vae", "vae", 0.25e9),
    ]


def _single_like():
    return [
        _component("transformer", "denoiser", 40.9e9, 60 * 0.68e9, 0.68e9),
        _component("text_encoder", "text_encoder", 16.6e9, 28 * 0.47e9, 0.47e9),
        _component("vae", "vae", 0.25e9),
    ]


@pytest.mark.parametrize("gib, memory, resident", [
    (141, "full", {"transformer", "transformer_2", "text_encoder", "vae"}),
    (48, "swap_experts", {"transformer", "vae"}),
    (24, "offload_blocks", {"transformer", "vae"}),
])
def test_auto_chooses_by_free_memory_for_two_experts(gib, memory, resident):
    plan = plan_memory(_a14b_like(), device_free_bytes=gib * GIB)
    assert (plan.memory, set(plan.resident), plan.fits) == (memory, resident, True)
    assert plan.peak_device_bytes <= gib * GIB
    assert plan.reason.startswith(f"auto chose memory={memory}")


def test_swap_experts_prefetches_only_when_both_experts_fit():
    # 48 GiB: one expert at a time; 62 GiB: both experts fit next to each other (the text encoder does not).
    tight = plan_memory(_a14b_like(), device_free_bytes=48 * GIB, requested="swap_experts")
    roomy = plan_memory(_a14b_like(), device_free_bytes=62 * GIB)
    assert (tight.prefetch, roomy.memory, roomy.prefetch) == (False, "swap_experts", True)
    assert set(roomy.resident) == {"transformer", "transformer_2", "vae"}
    assert roomy.placement == {"transformer": "swap", "transformer_2": "swap", "vae": "device",
                               "text_encoder": "on_demand"}
    # the denoising peak of the tight plan: VAE + one expert + activations (10 % of an expert)
    assert tight.peak_device_bytes == int(0.25e9) + int(28.6e9) + int(28.6e9) // 10


def test_text_encoder_too_large_even_alone_is_streamed_by_blocks():
    plan = plan_memory(_single_like(), device_free_bytes=12 * GIB)
    assert plan.memory == "offload_blocks"
    assert plan.placement["text_encoder"] == "blocks" and plan.placement["transformer"] == "blocks"


def test_single_denoiser_offloads_the_model_between_full_and_blocks():
    decisions = {gib: plan_memory(_single_like(), device_free_bytes=gib * GIB).memory for gib in (24, 48, 80)}
    assert decisions == {24: "offload_blocks", 48: "offload_model", 80: "full"}


def test_decode_is_tiled_only_when_it_would_not_fit():
    small = [_component("transformer", "denoiser", 1e9, 10 * 0.1e9, 0.1e9), _component("vae", "vae", 0.25e9)]
    untiled = plan_memory(small, device_free_bytes=12 * GIB, decode_size=(1280, 720))
    tiled = plan_memory(small, device_free_bytes=12 * GIB, decode_size=(1920, 1080))
    assert default_decode_bytes(1920, 1080) > 12 * GIB > default_decode_bytes(1280, 720)
    assert (untiled.vae_tiling, tiled.vae_tiling, tiled.fits) == (False, True, True)


def test_requested_plan_that_does_not_fit_names_needed_free_and_what_would_work():
    plan = plan_memory(_a14b_like(), device_free_bytes=24 * GIB, requested="full")
    assert plan.fits is False and plan.memory == "full"
    assert plan.peak_device_bytes > 24 * GIB
    needed = f"{plan.peak_device_bytes / GIB:.1f} GiB of device memory (24.0 GiB free)"
    assert needed in plan.reason and "memory=offload_blocks would fit" in plan.reason


def test_host_memory_is_checked_too():
    plan = plan_memory(_a14b_like(), device_free_bytes=24 * GIB, host_free_bytes=16 * GIB)
    assert plan.fits is False
    assert f"{plan.peak_host_bytes / GIB:.1f} GiB of host memory (16.0 GiB free)" in plan.reason


def test_hopeless_case_refuses_with_the_smallest_plan():
    plan = plan_memory(_a14b_like(), device_free_bytes=2 * GIB)
    assert (plan.memory, plan.fits) == ("offload_blocks", False)
    assert plan.reason.startswith("nothing fits: the smallest plan, offload_blocks, needs")
    assert "(2.0 GiB free)" in plan.reason


def test_swap_experts_on_a_single_denoiser_is_refused():
    plan = plan_memory(_single_like(), device_free_bytes=80 * GIB, requested="swap_experts")
    assert plan.fits is False and "two experts" in plan.reason and "memory=full would fit" in plan.reason


def test_json_has_the_agreed_fields():
    data = plan_memory(_a14b_like(), device_free_bytes=48 * GIB).to_json()
    assert {"memory", "resident", "peak_device_bytes", "peak_host_bytes", "fits", "reason"} <= set(data)
    assert data["memory"] == "swap_experts" and data["resident"] == ["vae", "transformer"]


def test_unknown_plan_is_an_error():
    with pytest.raises(ValueError, match="unknown memory plan 'half'"):
        plan_memory(_a14b_like(), device_free_bytes=GIB, requested="half")
