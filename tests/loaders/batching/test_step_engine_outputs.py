"""The step engine's batched outputs equal each request's run alone (issue 53): the Wan2.2 pair with requests at
different steps across the expert switch, Wan image-to-video, Qwen-Image with prompts of different lengths,
MiniMax-H3 (refused from batches by name, run alone), and a mixed-LoRA batch against each request's solo fused
run. Tolerances: ``engine_helpers``."""

from __future__ import annotations

import threading

import pytest

from engine_helpers import OWN_ROWS, SAME_BINDING, assert_close, batched_engine, on_threads, style_lora
from lorabind.loaders.dispatch.generation_steps import empty_latent, encode_text, image_to_video_latent
from lorabind.loaders.handles import FuseSpec, ModelHandle
from lorabind.usecases.sampling import SampleOptions, sample
from wan_i2v_helpers import example_image

PAIR = ("wan2.2_t2v_A14b_high_noise_lora_rank64_lightx2v_4step_1217.safetensors",
        "wan2.2_t2v_A14b_low_noise_lora_rank64_lightx2v_4step_1217.safetensors")
DISTILL = SampleOptions(seed=0, steps=4, cfg=1.0, shift=5.0)


def _pair(root) -> tuple:
    folder = root / "loras" / "lorabind-tiny"
    return (FuseSpec(str(folder / PAIR[0]), 1.0, "transformer", name="high"),
            FuseSpec(str(folder / PAIR[1]), 1.0, "transformer_2", name="low"))


def _run(handle, positive, negative, latent, options, **kwargs):
    samples, _, report = sample(handle, positive, negative, latent, options, **kwargs)
    return samples.samples, report


def test_the_wan22_pair_batches_requests_at_different_steps_across_the_expert_switch(load_tiny,
                                                                                      tiny_models_root):
    model = load_tiny("tiny-wan22-t2v")
    handle = ModelHandle(model, fuses=_pair(tiny_models_root))
    latent, negative = empty_latent(model, 32, 32, 5), encode_text(model, "blurry")
    prompts = [encode_text(model, text) for text in ("a cat", "a red fox in the snow")]
    options = [DISTILL, SampleOptions(seed=7, steps=4, cfg=1.0, shift=5.0)]
    alone = [_run(handle, prompts[i], negative, latent, options[i])[0] for i in range(2)]

    engine = batched_engine(2)
    second_may_start, second_in = threading.Event(), threading.Event()

    def first_request():
        def after_step(done, total):
            if done == 1:  # the second request joins while the first is at step 1 of 4
                second_may_start.set()
                assert second_in.wait(60)
        return _run(handle, prompts[0], negative, latent, options[0], on_step=after_step)

    def second_request():
        def joined(done, total):
            return None
        second_in.set()  # set as it enters; the first request's next forward waits for its first
        return _run(handle, prompts[1], negative, latent, options[1], on_step=joined)

    (first, error_a), (second, error_b) = on_threads([first_request, second_request], [None, second_may_start])
    assert error_a is None and error_b is None
    assert_close(first[0], alone[0], SAME_BINDING)
    assert_close(second[0], alone[1], SAME_BINDING)
    # steps: first 0..3 on transformer, transformer, transformer_2, transformer_2; the second joins at the
    # first's step 1 (both on the high-noise expert, one batch), then the experts differ for a step, then meet
    assert first[1]["batching"]["largest_batch"] == 2 and second[1]["batching"]["largest_batch"] == 2
    assert first[1]["batching"]["forwards"] == 4 and second[1]["batching"]["forwards"] == 4
    assert engine.in_flight() == 0


@pytest.mark.parametrize("name", ["tiny-wan22-i2v", "tiny-qwen-image"])
def test_image_to_video_and_qwen_image_batch_equal_their_runs_alone(load_tiny, name):
    model = load_tiny(name)
    handle = ModelHandle(model)
    if name == "tiny-qwen-image":  # prompts of different lengths: padded and masked in the batch
        latent = empty_latent(model, 32, 32, 1)
        texts = ("a cat", "a lighthouse on a rocky coast at dusk, oil painting", "red")
    else:
        latent = image_to_video_latent(model, example_image("start"), None, width=32, height=32, frames=5)
        texts = ("a cat", "a dog", "a bird")
    negative = encode_text(model, "blurry")
    prompts = [encode_text(model, text) for text in texts]
    options = [SampleOptions(seed=i, steps=3, cfg=cfg, shift=3.0) for i, cfg in enumerate((1.0, 4.0, 2.5))]
    alone = [_run(handle, prompts[i], negative, latent, options[i])[0] for i in range(3)]

    batched_engine(3)
    results = on_threads([lambda i=i: _run(handle, prompts[i], negative, latent, options[i]) for i in range(3)])
    for (got, error), want in zip(results, alone):
        assert error is None
        assert_close(got[0], want, SAME_BINDING)
        assert got[1]["batching"]["largest_batch"] == 3  # cond and uncond passes of all three meet


def test_a_mixed_lora_batch_equals_each_requests_solo_fused_run(load_tiny, tiny_models_root, tmp_path):
    """The distill pair every request shares stays fused; each request's own style LoRA (one per expert) runs on
    its own rows, at its own strength."""
    model = load_tiny("tiny-wan22-t2v")
    folder = tiny_models_root / "diffusers" / "tiny-wan22-t2v"
    pair = _pair(tiny_models_root)

    def style(seed: int, strength: float) -> tuple:
        files = [style_lora(folder, component, seed + i, tmp_path / f"style{seed}_{component}.safetensors")
                 for i, component in enumerate(("transformer", "transformer_2"))]
        return tuple(FuseSpec(path, strength, component, name=f"style{seed}-{component}")
                     for path, component in zip(files, ("transformer", "transformer_2")))

    handles = [ModelHandle(model, fuses=pair + style(300, 0.8)), ModelHandle(model, fuses=pair),
               ModelHandle(model, fuses=pair + style(310, 1.3))]
    latent, negative = empty_latent(model, 32, 32, 5), encode_text(model, "blurry")
    prompts = [encode_text(model, text) for text in ("a cat", "a dog", "a bird")]
    options = [SampleOptions(seed=i, steps=4, cfg=1.0, shift=5.0, enforce_contract=False) for i in range(3)]
    alone = [_run(handles[i], prompts[i], negative, latent, options[i])[0] for i in range(3)]

    batched_engine(3)
    results = on_threads([lambda i=i: _run(handles[i], prompts[i], negative, latent, options[i])
                          for i in range(3)])
    for (got, error), want in zip(results, alone):
        assert error is None
        assert_close(got[0], want, OWN_ROWS)
        assert got[1]["batching"]["largest_batch"] == 3
    reports = [got[1]["batching"] for got, _ in results]
    assert reports[0]["row_applied"] == ["style300-transformer", "style300-transformer_2"]
    assert reports[0]["fused_for_batch"] == ["high", "low"]  # the pair's norm and bias diffs have no row form
    assert reports[1]["row_applied"] == []
    assert reports[2]["row_applied"] == ["style310-transformer", "style310-transformer_2"]
    assert not any(hasattr(m, "_diffusers_hook") and m._diffusers_hook.get_hook("lorabind.row_lora")
                   for c in model.components.values() for m in c.modules())


def test_minimax_h3_requests_run_alone_and_say_why(mm_models):
    model = mm_models["plain"]
    handle = ModelHandle(model)
    latent = empty_latent(model, 32, 32, 5)
    prompts = [encode_text(model, text) for text in ("a cat", "a dog")]
    options = SampleOptions(seed=3, steps=2, cfg=1.0, shift=5.0)
    alone = [_run(handle, prompt, None, latent, options)[0] for prompt in prompts]

    batched_engine(2)
    results = on_threads([lambda p=p: _run(handle, p, None, latent, options) for p in prompts])
    for (got, error), want in zip(results, alone):
        assert error is None
        assert_close(got[0], want, SAME_BINDING)
        assert got[1]["batching"]["largest_batch"] == 1
        assert got[1]["batching"]["alone"].startswith("MiniMax-H3 runs one request per forward")
