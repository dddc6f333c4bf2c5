"""``lorabind run``'s progress: fusing has its own label, steps are steps, and a log file gets plain lines."""

from __future__ import annotations

import io

from lorabind.runtime import progress_display
from lorabind.runtime.progress_display import ProgressDisplay

PROMPT = {"1": {"class_type": "Loader"}, "6": {"class_type": "LoraBindSampler"}}


def work(node, value, total):
    return ("progress_state", {"prompt_id": "p", "nodes": {node: {"value": value, "max": total, "state": "running",
                                                                  "label": "binding LoRA layers"}}})


def feed(display, events):
    for name, data in events:
        display.on_event(name, data)
    display.close()


def sampler_events(layers=76, steps=4):
    return ([("execution_cached", {"nodes": ["1"]}), ("executing", {"node": "6"})]
            + [work("6", i, layers) for i in range(1, layers + 1)]
            + [("progress", {"node": "6", "value": i, "max": steps}) for i in range(1, steps + 1)]
            + [("executing", {"node": None})])


def test_not_a_terminal_gets_plain_lines_at_a_sensible_rate():
    stream = io.StringIO()
    feed(ProgressDisplay(PROMPT, 2, stream=stream), sampler_events())
    text = stream.getvalue()
    assert "\r" not in text and "\x1b" not in text
    # all 76 layers and 4 steps come within the interval: the first and the completing line of each bar
    assert text.splitlines() == ["1 node cached", "[2/2] node 6 (LoraBindSampler)",
                                 "node 6: binding LoRA layers 1/76", "node 6: binding LoRA layers 76/76",
                                 "node 6: steps 1/4", "node 6: steps 4/4"]


def test_lines_repeat_after_the_interval(monkeypatch):
    clock = iter(range(0, 1000, 3))  # every update 3 s after the previous one
    monkeypatch.setattr(progress_display.time, "monotonic", lambda: next(clock))
    stream = io.StringIO()
    feed(ProgressDisplay(PROMPT, 2, stream=stream), [work("6", i, 6) for i in range(1, 7)])
    assert [line.split()[-1] for line in stream.getvalue().splitlines()] == ["1/6", "3/6", "5/6", "6/6"]


def test_a_terminal_gets_a_fuse_bar_of_its_own_then_the_step_bar():
    stream = io.StringIO()
    display = ProgressDisplay(PROMPT, 2, stream=stream, interactive=True)
    seen = []
    original = display.view._tqdm

    def recording_tqdm(*args, **kwargs):
        bar = original(*args, **kwargs)
        seen.append((kwargs["desc"], kwargs["unit"], kwargs["total"]))
        return bar

    display.view._tqdm = recording_tqdm
    feed(display, sampler_events())
    assert seen == [("node 6 binding LoRA layers", "item", 76), ("node 6 steps", "step", 4)]
