"""A prompt's result across the ranks of a job, the same for every launcher (``run --parallel``, ``serve
--parallel``, a Ray group): what a rank tells rank 0 of its run (``outcome``), and rank 0's result turned into
the failure another rank had (``fail_as``), as ComfyUI's ``execution_error``."""

from __future__ import annotations

import time

from ..executor.definitions import full_type_name
from ..executor.execution import ExecutionResult
from .prompt_channel import PromptChannel, RankFailed


def outcome(result: ExecutionResult, channel: PromptChannel | None = None) -> dict:
    """What a rank tells rank 0 of its run: success, interrupted, and the error naming the rank and node."""
    error = result.error or {}
    message = str(error.get("exception_message", "")).strip()
    if channel is not None and message:
        where = f" at node {error.get('node_id')} ({error.get('node_type')})" if error.get("node_id") else ""
        message = f"rank {channel.rank} of {channel.world_size} failed{where}: {message}"
    return {"success": result.success, "interrupted": result.interrupted, "error": message or None,
            "node_id": error.get("node_id"), "node_type": error.get("node_type")}


def fail_as(result: ExecutionResult, prompt_id: str, failure: dict, on_event) -> None:
    """Turn ``result`` into the failure another rank had (``failure``: an ``outcome``, or {"error", "node_id",
    "node_type"}), as ComfyUI's execution_error, sent to ``on_event`` too."""
    error = {"prompt_id": prompt_id, "node_id": failure.get("node_id"), "node_type": failure.get("node_type"),
             "executed": list(result.executed), "exception_message": f"{failure['error'] or 'a rank failed'}\n",
             "exception_type": full_type_name(RankFailed), "traceback": [], "current_inputs": {},
             "current_outputs": [], "timestamp": int(time.time() * 1000)}
    if on_event is not None:
        on_event("execution_error", error)
    result.success, result.error = False, error
    result.messages.append(["execution_error", error])


def failed_on_another_rank(result: ExecutionResult) -> bool:
    """The result is another rank's failure (rank 0 reports it), not this rank's own."""
    return (result.error or {}).get("exception_type") == full_type_name(RankFailed)
