"""``lorabind run --parallel`` on the job's one rank protocol (``runtime/parallel/run_ranks.py``), two CPU ranks
over gloo: an interrupt and a failure mean what they mean under ``serve --parallel`` and a Ray group. A Ctrl-C
on rank 0 stops every rank at the same step, each ending with 130 and only rank 0 saying so; a node that fails on
one rank fails the run on both, and rank 0 names the rank and the node (on the original main the other rank ran
on alone until the launcher killed it, and rank 0 reported nothing)."""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
from pathlib import Path

import pytest

import lorabind
from gloo_ranks import run_ranks
from lorabind.loaders.models.store import clear_cache
from lorabind.runtime.cli import main
from lorabind.runtime.progress_display import ProgressDisplay

pytestmark = pytest.mark.slow

WORKFLOW = Path(lorabind.__file__).parent / "workflows" / "api" / "qwen_image_lightning.api.json"


def _command(workflow: Path, root: Path, output: Path) -> list:
    return ["run", str(workflow), "--models", str(root), "--output", str(output), "--parallel", "ulysses=2"]


@contextlib.contextmanager
def _recording_steps(steps: list, interrupt_at: int | None):
    """Every progress value this rank's sampler reports goes into ``steps``; at ``interrupt_at`` the process
    sends itself SIGINT, as a terminal's Ctrl-C reaches rank 0 through the launcher."""
    original = ProgressDisplay.on_event

    def on_event(display, name, data):
        if name == "progress":
            steps.append(int(data["value"]))
            if interrupt_at is not None and data["value"] == interrupt_at:
                os.kill(os.getpid(), signal.SIGINT)
        return original(display, name, data)

    ProgressDisplay.on_event = on_event
    try:
        yield
    finally:
        ProgressDisplay.on_event = original


def run_rank(rank: int, world_size: int, argv: list, interrupt_at: int | None, failing_node: str | None) -> dict:
    """One rank's exit code, stderr and the steps its sampler reported; rank 1 fails at ``failing_node``'s class
    when one is named (its function raises there, on that rank only)."""
    from lorabind.runtime.core_nodes import runtime_node_classes

    err, steps, restore = io.StringIO(), [], None
    if rank == 1 and failing_node is not None:
        node_class = runtime_node_classes()[0][failing_node]
        function, restore = node_class.FUNCTION, (node_class, getattr(node_class, node_class.FUNCTION))

        def failing(*args, **kwargs):
            raise RuntimeError("the disk of rank 1 is full")
        setattr(node_class, function, failing)
    try:
        with contextlib.redirect_stderr(err), _recording_steps(steps, interrupt_at if rank == 0 else None):
            code = main(argv)
    finally:
        if restore is not None:
            setattr(restore[0], restore[0].FUNCTION, restore[1])
        clear_cache()
    return {"code": code, "stderr": err.getvalue(), "steps": steps}


def test_ctrl_c_on_rank_0_stops_every_rank_at_the_same_step(tiny_models_root, tmp_path):
    prompt = json.loads(WORKFLOW.read_text())
    prompt["6"]["inputs"].update(model=["1", 0], steps=40)  # no distill LoRA: any step count
    workflow = tmp_path / "long.api.json"
    workflow.write_text(json.dumps(prompt))
    ranks = run_ranks(run_rank, _command(workflow, tiny_models_root, tmp_path / "out"), 3, None, out_dir=tmp_path)
    assert [r["code"] for r in ranks] == [130, 130], ranks
    assert 3 <= max(ranks[0]["steps"]) < 40 and max(ranks[0]["steps"]) == max(ranks[1]["steps"])
    assert "lorabind run: interrupted" in ranks[0]["stderr"]
    assert "failed" not in ranks[0]["stderr"] + ranks[1]["stderr"] and "interrupted" not in ranks[1]["stderr"]
    assert not any((tmp_path / "out").rglob("*.png"))


@pytest.mark.parametrize("node, node_id", [("LoraBindTextEncode", "2"), ("LoraBindSaveImage", "8")])
def test_a_node_failing_on_one_rank_fails_the_run_on_both_and_rank_0_names_the_rank(node, node_id,
                                                                                     tiny_models_root, tmp_path):
    """The text encode fails on rank 1 before the sampler (rank 0 stops at its next node), the saver after it
    (rank 0 has finished: its result fails by rank 1's outcome)."""
    ranks = run_ranks(run_rank, _command(WORKFLOW, tiny_models_root, tmp_path / "out"), None, node, out_dir=tmp_path)
    assert [r["code"] for r in ranks] == [1, 1], ranks
    named = f"rank 1 of 2 failed at node {node_id} ({node}): "
    assert named in ranks[0]["stderr"] and "the disk of rank 1 is full" in ranks[0]["stderr"], ranks[0]["stderr"]
    assert ranks[1]["stderr"].count("the disk of rank 1 is full") == 1  # its own failure, said once
    assert ranks[0]["steps"] == ([] if node_id == "2" else [1, 2, 3, 4])
