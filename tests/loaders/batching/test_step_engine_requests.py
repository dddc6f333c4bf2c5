"""Each request in a batch on its own (issue 53): an interrupt stops only that request, a request whose forward
goes non-finite fails alone, a strength schedule runs in a batch of its own, a layer that hides the batch
dimension makes the batch run one by one; nothing is left hooked and unbinding still restores every weight."""

from __future__ import annotations

import pytest

from engine_helpers import SAME_BINDING, assert_close, batched_engine, on_threads
from lorabind.loaders.batching import row_lora
from lorabind.loaders.batching.execution import NonFiniteOutput
from lorabind.loaders.binding.bind import unbind
from lorabind.loaders.binding.strength_schedules import parse_strength_schedule
from lorabind.loaders.dispatch.generation_steps import empty_latent, encode_text
from lorabind.loaders.handles import ConditioningHandle, FuseSpec, ModelHandle
from lorabind.runtime.context import InterruptedByUser
from lorabind.usecases.sampling import SampleOptions, sample

WAN21_DISTILL = "wan2.1_t2v_14b_lora_rank64_lightx2v_4step.safetensors"


@pytest.fixture
def wan21(load_tiny):
    model = load_tiny("tiny-wan21-t2v")
    prompts = [encode_text(model, text) for text in ("a cat", "a dog", "a bird")]
    return model, prompts, encode_text(model, "blurry"), empty_latent(model, 32, 32, 5)


def _options(seed: int, cfg: float = 1.0) -> SampleOptions:
    return SampleOptions(seed=seed, steps=4, cfg=cfg, shift=5.0, enforce_contract=False)


def _samples(handle, positive, negative, latent, options, **kwargs):
    return sample(handle, positive, negative, latent, options, **kwargs)[0].samples


def test_an_interrupt_stops_only_its_request(wan21):
    model, prompts, negative, latent = wan21
    handle = ModelHandle(model)
    alone = [_samples(handle, prompts[i], negative, latent, _options(i)) for i in (0, 2)]
    stop = {"now": False}

    def interrupted():
        if stop["now"]:
            raise InterruptedByUser()

    def stop_after_two(done, total):
        stop["now"] = done >= 2

    batched_engine(3)
    results = on_threads([
        lambda: _samples(handle, prompts[0], negative, latent, _options(0)),
        lambda: _samples(handle, prompts[1], negative, latent, _options(1), on_step=stop_after_two,
                         check_interrupt=interrupted),
        lambda: _samples(handle, prompts[2], negative, latent, _options(2))])
    assert isinstance(results[1][1], InterruptedByUser)
    assert_close(results[0][0], alone[0], SAME_BINDING)
    assert_close(results[2][0], alone[1], SAME_BINDING)


def test_a_request_whose_forward_goes_non_finite_fails_alone(wan21):
    model, prompts, negative, latent = wan21
    handle = ModelHandle(model)
    alone = [_samples(handle, prompts[i], negative, latent, _options(i, cfg=3.0)) for i in (0, 2)]
    poisoned = ConditioningHandle(embeds=prompts[1].embeds * float("nan"), family=model.family, text="nan")

    batched_engine(3)
    results = on_threads([lambda i=i, p=p: _samples(handle, p, negative, latent, _options(i, cfg=3.0))
                          for i, p in enumerate((prompts[0], poisoned, prompts[2]))])
    assert isinstance(results[1][1], NonFiniteOutput)
    assert "NaN or infinite values for this request" in str(results[1][1])
    assert_close(results[0][0], alone[0], SAME_BINDING)
    assert_close(results[2][0], alone[1], SAME_BINDING)


def test_a_strength_schedule_runs_in_a_batch_of_its_own(wan21, tiny_models_root):
    model, prompts, negative, latent = wan21
    distill = str(tiny_models_root / "loras" / "lorabind-tiny" / WAN21_DISTILL)
    faded = FuseSpec(distill, 1.0, "transformer", name="faded",
                     strength_schedule=parse_strength_schedule("1, 0.5, 0.25, 0", "test"))
    handles = [ModelHandle(model, fuses=(faded,)), ModelHandle(model, fuses=(FuseSpec(distill, 1.0, "transformer"),))]
    alone = [_samples(handles[i], prompts[i], negative, latent, _options(i)) for i in range(2)]

    batched_engine(2)
    results = [sample(handles[i], prompts[i], negative, latent, _options(i)) for i in range(2)]
    threaded = on_threads([lambda i=i: sample(handles[i], prompts[i], negative, latent, _options(i))
                           for i in range(2)])
    for (got, error), want, single in zip(threaded, alone, results):
        assert error is None
        assert_close(got[0].samples, want, SAME_BINDING)
        assert_close(single[0].samples, want, SAME_BINDING)
    assert threaded[0][0][2]["batching"]["largest_batch"] == 1
    assert threaded[0][0][2]["strength_schedules"][0]["strengths"] == [1.0, 0.5, 0.25, 0.0]


def test_a_layer_that_hides_the_batch_makes_the_batch_run_one_by_one(wan21, tiny_models_root, monkeypatch,
                                                                     tmp_path):
    """If a targeted linear saw the batch anywhere but first, its rows could not be told apart: the batch is run
    again request by request, each with its LoRAs fused, and still equals the solo runs."""
    from engine_helpers import OWN_ROWS, style_lora

    model, prompts, negative, latent = wan21
    folder = tiny_models_root / "diffusers" / "tiny-wan21-t2v"
    styles = [FuseSpec(style_lora(folder, "transformer", seed, tmp_path / f"s{seed}.safetensors"), 0.7,
                       "transformer", name=f"s{seed}") for seed in (41, 42)]
    handles = [ModelHandle(model, fuses=(style,)) for style in styles]
    alone = [_samples(handles[i], prompts[i], negative, latent, _options(i)) for i in range(2)]

    def refuse(self, module, state, args, output):
        raise row_lora.RowLoraError("test: this layer flattens its batch")

    monkeypatch.setattr(row_lora.RowLora, "_add_rows", refuse)
    batched_engine(2)
    results = on_threads([lambda i=i: _samples(handles[i], prompts[i], negative, latent, _options(i))
                          for i in range(2)])
    for (got, error), want in zip(results, alone):
        assert error is None
        assert_close(got, want, OWN_ROWS)
    unbind(model)
    state = model.binding_state
    assert not state.patcher.patched and not state.fuses
