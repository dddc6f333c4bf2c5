"""Per-execution context shared by the executor and long-running nodes.

Why: nodes must report progress and honour interrupts from *inside* long work (the sampler loop), but they
must not import the executor. The executor installs an ``ExecutionContext`` in a ``ContextVar`` for the node
it is running; nodes reach it through ``nodes.comfy_bridge`` (which prefers ComfyUI's own mechanisms when the
pack runs inside ComfyUI). No torch imports here: the CLI imports this module on its fast path.
"""

from __future__ import annotations

import contextvars
import threading
from dataclasses import dataclass, field
from typing import Callable, Optional

from .preview_options import PreviewOptions


class InterruptedByUser(Exception):
    """Raised inside a node (or between nodes) when the user asked to stop the running prompt."""

    def __init__(self, message: str = "Execution interrupted by the user."):
        super().__init__(message)


ProgressCallback = Callable[[str, int, int, Optional[dict]], None]
"""(node_id, value, max, extra) — called for every progress update of the running node (sampling steps)."""

PreviewCallback = Callable[[str, int, int, bytes], None]
"""(node_id, value, max, JPEG bytes) — a live preview of the running sampler's step ``value`` of ``max``."""

WorkCallback = Callable[[str, str, int, int], None]
"""(node_id, label, value, max) — progress of other work inside a node (fusing LoRA layers). Kept apart from
steps because ComfyUI clients read every ``progress`` message as a sampling step."""


@dataclass
class ExecutionContext:
    prompt_id: str = ""
    node_id: str = ""
    interrupt_event: threading.Event = field(default_factory=threading.Event)
    on_progress: Optional[ProgressCallback] = None
    on_work: Optional[WorkCallback] = None
    previews: Optional[PreviewOptions] = None  # None: the prompt asked for no previews, nothing is computed
    on_preview: Optional[PreviewCallback] = None

    def report_progress(self, value: int, total: int, extra: Optional[dict] = None) -> None:
        if self.on_progress is not None:
            self.on_progress(self.node_id, int(value), int(total), extra)

    def report_preview(self, value: int, total: int, image: bytes) -> None:
        if self.on_preview is not None:
            self.on_preview(self.node_id, int(value), int(total), image)

    def report_work(self, label: str, value: int, total: int) -> None:
        if self.on_work is not None:
            self.on_work(self.node_id, label, int(value), int(total))

    def check_interrupted(self) -> None:
        if self.interrupt_event.is_set():
            raise InterruptedByUser()


_current: contextvars.ContextVar[Optional[ExecutionContext]] = contextvars.ContextVar(
    "lorabind_execution_context", default=None
)


def current_context() -> Optional[ExecutionContext]:
    return _current.get()


def set_current_context(ctx: Optional[ExecutionContext]) -> contextvars.Token:
    return _current.set(ctx)


def reset_current_context(token: contextvars.Token) -> None:
    _current.reset(token)
