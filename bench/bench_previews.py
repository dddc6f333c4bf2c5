"""Live previews (issue 56): the time per denoising step with and without serve's previews, side by side.

The end-to-end case (``bench_end_to_end``: Wan2.1-1.3B's transformer at real width, random weights, a rank-64 distill
LoRA fused, 64x64, 1 frame, 4 steps) runs through the headless runtime (``PromptExecutor``: what ``lorabind serve``
executes), alternately without previews and with every step previewed (latent2rgb, fitted into 512 pixels, JPEG:
``--preview-method latent2rgb --preview-interval 0``, the most a prompt can ask for). The step time is taken
between a prompt's first and last ``progress`` events, so it holds the previews of all but the first step and
nothing else of the prompt. The preview work itself (map, fit, encode) is also timed on its own, on the same runs.

Figures: ``previews_step_vs_plain`` (seconds per step with previews / without; goal <= 1.02, the issue's "within 2%
of the step") and ``preview_share_of_step`` (the preview work per step / the plain step, the same goal as a share,
steadier on a shared machine than the difference of two step times). ``--quick``: the tiny sizes (smoke test).
"""

from __future__ import annotations

import os
import statistics
import time

from lorabind.loaders.models import store
from lorabind.runtime import folder_paths
from lorabind.runtime.core_nodes import runtime_node_classes
from lorabind.runtime.executor import PromptExecutor
from lorabind.runtime.preview_options import EXTRA_DATA_KEY, PREVIEW_EVENT, PreviewOptions
from lorabind.usecases import previews as headless_previews

from .bench_end_to_end import FULL_CASE, MODEL_NAME, QUICK_CASE, write_loras, write_model
from .bench_serving import _prompt as serving_prompt

FIGURES = ("previews_step_vs_plain", "preview_share_of_step")
EVERY_STEP = {EXTRA_DATA_KEY: PreviewOptions("latent2rgb", interval_ms=0).for_prompt({})}


def run(workdir: str, quick: bool, reps: int = 5) -> dict:
    """The figures on the case's model: ``workdir/serving``'s when ``bench_serving`` wrote it there already (same
    case), else one written into ``workdir/previews``."""
    case = QUICK_CASE if quick else FULL_CASE
    root = os.path.join(workdir, "serving")
    if not os.path.isdir(os.path.join(root, "diffusers", MODEL_NAME)):
        root = os.path.join(workdir, "previews")
        write_model(root, case)
        write_loras(os.path.join(root, "loras"), case.size)
    folder_paths.configure(models_root=root, output_dir=os.path.join(root, "output"))
    executor = PromptExecutor(runtime_node_classes()[0])
    spent: list = []  # seconds inside the previewer, per preview
    timed = _timing(headless_previews.StepPreviewer.__call__, spent)
    headless_previews.StepPreviewer.__call__ = timed
    try:
        _step_seconds(executor, case, 0, {})  # warm-up: load, encode, bind
        plain, previewed, previews = [], [], []
        for rep in range(reps):
            plain.append(_step_seconds(executor, case, 2 * rep + 1, {}))
            count = len(spent)
            previewed.append(_step_seconds(executor, case, 2 * rep + 2, EVERY_STEP))
            previews.append(len(spent) - count)
    finally:
        headless_previews.StepPreviewer.__call__ = timed.__wrapped__
        store.clear_cache()
    plain_s, previewed_s, preview_s = statistics.median(plain), statistics.median(previewed), statistics.median(spent)
    return {"plain_step_s": plain_s, "previews_step_s": previewed_s, "preview_ms": preview_s * 1000,
            "previews_per_run": statistics.median(previews), "previews_step_vs_plain": previewed_s / plain_s,
            "preview_share_of_step": preview_s / plain_s,
            "label": f"{'tiny' if quick else 'Wan2.1-1.3B width'}, {case.width}x{case.height}, {case.frames} frame"}


def _timing(call, spent: list):
    def timed(previewer, *args):
        start = time.perf_counter()
        try:
            return call(previewer, *args)
        finally:
            spent.append(time.perf_counter() - start)

    timed.__wrapped__ = call
    return timed


def _step_seconds(executor, case, index: int, extra_data: dict) -> float:
    """One run of the prompt (seed ``index``: the sampler and what follows run again): seconds per step between its
    first and last ``progress`` events."""
    steps: list = []
    events: list = []

    def on_event(name: str, data: dict) -> None:
        if name == "progress":
            steps.append(time.perf_counter())
        events.append(name)

    result = executor.execute(serving_prompt(case, index, "one"), f"previews-{index}", extra_data=extra_data,
                              on_event=on_event)
    if not result.success:
        raise RuntimeError(f"previews bench: the prompt failed: {result.error}")
    if extra_data and events.count(PREVIEW_EVENT) != len(steps):
        raise RuntimeError(f"previews bench: {events.count(PREVIEW_EVENT)} previews for {len(steps)} steps")
    return (steps[-1] - steps[0]) / (len(steps) - 1)


def print_report(result: dict, print_table) -> None:
    print_table(f"Live previews: seconds per step ({result['label']}, 4 steps, median)",
                [("without previews", f"{result['plain_step_s']:.4f}"),
                 ("every step previewed (latent2rgb, 512 px JPEG)", f"{result['previews_step_s']:.4f}"),
                 ("with / without", f"{result['previews_step_vs_plain']:.3f}"),
                 ("one preview (map, fit, encode), ms", f"{result['preview_ms']:.2f}"),
                 ("preview / step", f"{result['preview_share_of_step']:.4f}")])


if __name__ == "__main__":
    import argparse
    import tempfile

    from .measure import print_table

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="lorabind-bench-previews-") as tmp:
        outcome = run(tmp, args.quick, 2 if args.quick else 5)
    print_report(outcome, print_table)
    for name in FIGURES:
        print(f"{name}: {outcome[name]:.4f}")
