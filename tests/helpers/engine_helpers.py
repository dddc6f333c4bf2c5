"""Shared by the step engine's tests: requests run on threads through an installed engine, each against the same
request run alone (no engine), and style LoRAs (plain low-rank pairs on a model's block linears, what a user's
style or character LoRA is) written beside the fixtures.

Why the tolerances: a batched forward computes each request's rows with the same weights, but a matrix product
over more rows may block its sums differently (float32 here, ~1e-6 of the latents' size), and a LoRA applied
to a request's own rows (unfused: W·x + s·B(A·x)) rounds otherwise than the same LoRA fused into W (~1e-5). The
tiny models' latents reach magnitudes of about 20 after 4 steps. Measured on the 2-core AVX-512 machine:
same binding at most 1.1e-6, own LoRAs per row at most 2.9e-5; both bounds below hold them with margin.
"""

from __future__ import annotations

import threading
from pathlib import Path

import torch

SAME_BINDING = {"rtol": 1e-5, "atol": 1e-5}
OWN_ROWS = {"rtol": 1e-4, "atol": 2e-4}
THREAD_TIMEOUT_S = 300


def style_lora(model_dir, component: str, seed: int, path: Path) -> str:
    """A plain low-rank LoRA (lightx2v's layout, blocks' linear pairs only: no diffs, no alpha-less heads) for
    ``component`` of the tiny model in ``model_dir``, written to ``path``."""
    from safetensors.torch import save_file

    from lorabind.tiny_models.lora_fixtures import wan_native_lora

    config = _config(Path(model_dir), component)
    tensors = {key: value for key, value in wan_native_lora(config, seed=seed).items()
               if ".blocks." in key and (".lora_" in key or key.endswith(".alpha"))}
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(path))
    return str(path)


def _config(model_dir: Path, component: str) -> dict:
    import json

    return json.loads((model_dir / component / "config.json").read_text())


def on_threads(jobs: list, starts: list | None = None) -> list:
    """Run each job (a callable) on its own thread; job ``i`` waits for ``starts[i]`` (an Event) when given.
    Returns each job's (result, exception)."""
    results = [(None, None)] * len(jobs)

    def run(index, job):
        if starts is not None and starts[index] is not None:
            starts[index].wait(THREAD_TIMEOUT_S)
        try:
            results[index] = (job(), None)
        except BaseException as exc:  # noqa: B902 (the test asserts on it)
            results[index] = (None, exc)

    threads = [threading.Thread(target=run, args=(i, job), daemon=True) for i, job in enumerate(jobs)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(THREAD_TIMEOUT_S)
    assert not any(thread.is_alive() for thread in threads), "a request never finished"
    return results


def batched_engine(max_batch: int, gather_window_s: float = 5.0):
    """A step engine installed for the test (the root conftest removes it afterwards). Its gather window is long:
    it waits for every request between two forwards to submit its next one, so which forwards meet in a batch
    does not depend on how loaded the test machine is (a request always submits within milliseconds)."""
    from lorabind.loaders.batching import engine

    installed = engine.StepEngine(max_batch=max_batch, gather_window_s=gather_window_s)
    engine.install(installed)
    return installed


def assert_close(got, want, tolerance: dict) -> None:
    torch.testing.assert_close(got, want, **tolerance)
