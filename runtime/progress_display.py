"""What ``lorabind run`` shows while a prompt executes: the nodes, the sampler's steps, and other work inside a
node (fusing LoRA layers) under its own label — on a terminal as tqdm bars, otherwise as plain lines.

Why two forms: tqdm redraws with carriage returns and cursor escapes, which fill a log file with noise. When the
stream is not a terminal, each node start is one line and progress is one line at most every
``LINE_INTERVAL_S`` seconds per bar, plus the line that completes it. No torch imports here (CLI fast path).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from ..loaders.io.atomic_files import write_atomically
from .preview_options import PREVIEW_EVENT

LINE_INTERVAL_S = 5.0


class ProgressDisplay:
    """Feeds on the executor's events (``on_event``): ``executing``, ``execution_cached``, ``progress`` (sampling
    steps) and ``progress_state`` (labelled work such as "binding LoRA layers")."""

    def __init__(self, prompt: dict, node_count: int, stream=None, interactive: bool | None = None):
        self.prompt = prompt
        self.stream = stream if stream is not None else sys.stderr
        if interactive is None:
            interactive = bool(getattr(self.stream, "isatty", lambda: False)())
        self.view = _Bars(self.stream, node_count) if interactive else _Lines(self.stream, node_count)
        self.current: str | None = None

    def on_event(self, name: str, data: dict) -> None:
        if name == "execution_cached":
            self.view.cached(len(data.get("nodes", [])))
        elif name == "executing":
            self.view.node_done(self.current)
            self.current = data.get("node")
            if self.current is not None:
                self.view.node_started(self.current, self.prompt[self.current]["class_type"])
        elif name == "progress":
            self.view.bar(data["node"], "steps", "step", data["value"], data["max"])
        elif name == "progress_state":
            for node_id, entry in (data.get("nodes") or {}).items():
                self.view.bar(node_id, entry.get("label") or "working", "item", entry["value"], entry["max"])

    def close(self) -> None:
        self.view.close()


class _Bars:
    """tqdm: one bar over the nodes, one for the running node's current work (its label, then its steps)."""

    def __init__(self, stream, node_count: int):
        from tqdm import tqdm

        self._tqdm = tqdm
        self.stream = stream
        self.nodes = tqdm(total=node_count, desc="nodes", unit="node", file=stream, position=0)
        self.work = None
        self.work_key = None
        self.finished: set = set()

    def cached(self, count: int) -> None:
        self.nodes.update(count)

    def node_started(self, node_id: str, class_type: str) -> None:
        self.nodes.set_postfix_str(f"{node_id} {class_type}")

    def node_done(self, node_id) -> None:
        self._close_work()
        if node_id is not None and node_id not in self.finished:
            self.finished.add(node_id)
            self.nodes.update(1)

    def bar(self, node_id: str, label: str, unit: str, value: int, total: int) -> None:
        key = (node_id, label, total)
        if self.work_key != key:
            self._close_work()
            self.work_key = key
            self.work = self._tqdm(total=total, desc=f"node {node_id} {label}", unit=unit, file=self.stream,
                                   position=1, leave=False)
        self.work.update(value - self.work.n)  # update, not assigning n: tqdm's rate stays per item

    def _close_work(self) -> None:
        if self.work is not None:
            self.work.close()
            self.work, self.work_key = None, None

    def close(self) -> None:
        self._close_work()
        self.nodes.close()


class _Lines:
    """Plain lines: no carriage return, no cursor escape, at most one progress line per bar every few seconds."""

    def __init__(self, stream, node_count: int):
        self.stream = stream
        self.node_count = node_count
        self.started = 0
        self.last_line: dict = {}  # (node, label) -> monotonic time of its last line

    def _print(self, text: str) -> None:
        print(text, file=self.stream, flush=True)

    def cached(self, count: int) -> None:
        self.started += count
        if count:
            self._print(f"{count} node{'' if count == 1 else 's'} cached")

    def node_started(self, node_id: str, class_type: str) -> None:
        self.started += 1
        self._print(f"[{self.started}/{self.node_count}] node {node_id} ({class_type})")

    def node_done(self, node_id) -> None:
        pass

    def bar(self, node_id: str, label: str, unit: str, value: int, total: int) -> None:
        key = (node_id, label)
        now = time.monotonic()
        last = self.last_line.get(key)
        if value < total and last is not None and now - last < LINE_INTERVAL_S:
            return
        self.last_line[key] = now
        self._print(f"node {node_id}: {label} {value}/{total}")

    def close(self) -> None:
        pass


class PreviewFolder:
    """``run --preview DIR``: each live preview event's JPEG as ``DIR/node<ID>_step<K>of<N>.jpg`` (a rerun writes
    the same names again), each written whole or not at all."""

    def __init__(self, folder: str):
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.written: list = []

    def on_event(self, name: str, data: dict) -> None:
        if name != PREVIEW_EVENT:
            return
        path = os.path.join(self.folder, f"node{data['node']}_step{data['value']}of{data['max']}.jpg")
        write_atomically(path, lambda temp: Path(temp).write_bytes(data["image"]))
        self.written.append(path)
