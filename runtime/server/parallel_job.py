"""``lorabind serve --parallel``: rank 0 serves HTTP and WebSocket as a plain server does; the other ranks serve
nobody and run what rank 0 hands them, so every prompt executes SPMD on all ranks (each rank takes part in
each split step).

The seam is the worker's executor: on rank 0 it is ``RankZeroExecutor``, which sends each prompt down the
``PromptChannel`` before running it here in lockstep with the other ranks, and merges their outcomes into the
one result the worker records. Everything before the queue (validation, the contract check) happens once, on rank
0, before any rank loads or binds anything for the prompt, so a refusal reaches the client as it does today.
"""

from __future__ import annotations

import gc
import threading
import time

import torch

from ...loaders.distributed.process_group import DEFAULT_TIMEOUT_S, ParallelRunError, rank_from_environment
from ...loaders.models import store as model_store
from .. import folder_paths
from ..core_nodes import runtime_node_classes
from ..executor import PromptExecutor
from ..executor.definitions import full_type_name
from ..executor.execution import ExecutionResult
from ..parallel.launch import launch_ranks
from ..parallel.prompt_channel import Lockstep, PromptChannel, RankFailed
from ..parallel.ranks import rank_of_job, unseen_rank
from .app import run_server


def serve_job(config, spec, argv: list[str], timeout_s: float = DEFAULT_TIMEOUT_S) -> int:
    """Outside a job: start the ranks (each runs this command again). Inside one (ours or torchrun's): serve as
    rank 0, or follow rank 0."""
    job = rank_from_environment()
    if job is None:
        print(f"lorabind serve: --parallel {spec.describe()}: starting {spec.world_size} ranks", flush=True)
        return launch_ranks(spec.world_size, argv, command="serve")
    rank = job[0]
    try:
        with rank_of_job(spec, job[2]) as (rank, seen):
            channel = PromptChannel.open(timeout_s)
            if seen:
                return _serve_as_rank_zero(config, channel)
            with unseen_rank() as (scratch, _null):
                return follow_rank_zero(config, channel, scratch)
    except ParallelRunError as exc:
        print(f"lorabind serve: rank {rank}: {exc}")
        return 2


def _serve_as_rank_zero(config, channel: PromptChannel) -> int:
    executor = RankZeroExecutor(PromptExecutor(runtime_node_classes()[0]), channel)
    # No template thumbnails: rendering one is a prompt, which here would have to be one of the job's prompts (a
    # plain `lorabind serve` renders them once into the state folder, where this server finds them).
    run_server(config, executor=executor, unload_models=executor.unload_models, render_thumbnails=False)
    return 0


class RankZeroExecutor:
    """The worker's executor on rank 0: each prompt goes to every rank, then runs here in lockstep with them; its
    result fails when any rank failed, naming the rank. ``/free`` reaches every rank through ``reset_cache`` and
    ``unload_models``."""

    def __init__(self, local, channel: PromptChannel):
        self.local, self.channel = local, channel

    def reset_cache(self) -> None:
        self.channel.send({"kind": "free", "unload": False})
        self.local.reset_cache()

    def unload_models(self) -> None:
        self.channel.send({"kind": "free", "unload": True})
        model_store.clear_cache()

    def execute(self, prompt: dict, prompt_id: str, extra_data: dict | None = None, on_event=None,
                interrupt_event: threading.Event | None = None, execute_outputs: list | None = None
                ) -> ExecutionResult:
        requested = interrupt_event if interrupt_event is not None else threading.Event()
        requested.clear()  # as the executor does: an interrupt sent before the prompt starts is not for it
        number = self.channel.send({"kind": "prompt", "prompt": prompt, "prompt_id": prompt_id,
                                    "extra_data": extra_data or {}, "outputs": execute_outputs})
        lockstep = Lockstep(self.channel, number, requested)
        result, raised = ExecutionResult(success=False), None
        try:
            result = self.local.execute(prompt, prompt_id, extra_data, lockstep.wrap(on_event), lockstep.agreed,
                                        execute_outputs)
        except RankFailed as exc:  # another rank failed before this one started a node: fail where it failed
            _fail(result, prompt_id, {"error": str(exc), "node_id": exc.node_id, "node_type": exc.node_type},
                  on_event)
        except Exception as exc:  # e.g. the prompt no longer validates: the others stop at their next sync point
            lockstep.report_failure(None, None, f"{full_type_name(type(exc))}: {exc}")
            raised = exc
        lockstep.finish(_outcome(result))
        others = lockstep.outcomes()
        lockstep.forget(number)
        if not all(o["success"] or o["interrupted"] for o in [_outcome(result), *others.values()]):
            self.reset_cache()  # a rank that failed ran fewer nodes: no rank keeps outputs the others lack
        if raised is not None:
            raise raised
        late = [o for o in others.values() if not (o["success"] or o["interrupted"])]
        if result.success and late:  # a rank failed after the last sync point (a decode, a saver)
            _fail(result, prompt_id, late[0], on_event)
        return result


def _outcome(result: ExecutionResult, channel: PromptChannel | None = None) -> dict:
    """What a rank tells rank 0 of its run: success, interrupted, and the error naming the rank and node."""
    error = result.error or {}
    message = str(error.get("exception_message", "")).strip()
    if channel is not None and message:
        where = f" at node {error.get('node_id')} ({error.get('node_type')})" if error.get("node_id") else ""
        message = f"rank {channel.rank} of {channel.world_size} failed{where}: {message}"
    return {"success": result.success, "interrupted": result.interrupted, "error": message or None,
            "node_id": error.get("node_id"), "node_type": error.get("node_type")}


def _fail(result: ExecutionResult, prompt_id: str, failure: dict, on_event) -> None:
    """Turn ``result`` into the failure another rank had, as ComfyUI's execution_error (sent to the client)."""
    error = {"prompt_id": prompt_id, "node_id": failure.get("node_id"), "node_type": failure.get("node_type"),
             "executed": list(result.executed), "exception_message": f"{failure['error'] or 'a rank failed'}\n",
             "exception_type": full_type_name(RankFailed), "traceback": [], "current_inputs": {},
             "current_outputs": [], "timestamp": int(time.time() * 1000)}
    if on_event is not None:
        on_event("execution_error", error)
    result.success, result.error = False, error
    result.messages.append(["execution_error", error])


def follow_rank_zero(config, channel: PromptChannel, scratch: str) -> int:
    """A rank other than 0: run each prompt rank 0 sends (its files go to ``scratch``), until rank 0 stops."""
    config = config.resolved()
    folder_paths.configure(models_root=config.models_root, output_dir=scratch, input_dir=config.input_dir,
                           temp_dir=scratch)
    for folder in config.lora_dirs:
        folder_paths.add_model_folder_path("loras", folder)
    executor = PromptExecutor(runtime_node_classes()[0])
    while (received := channel.receive()) is not None:
        number, command = received
        if command["kind"] == "free":
            executor.reset_cache()
            if command["unload"]:
                model_store.clear_cache()
            gc.collect()
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
        elif command["kind"] == "prompt":
            _run_followed(executor, Lockstep(channel, number), command)
    return 0


def _run_followed(executor, lockstep: Lockstep, command: dict) -> None:
    result = ExecutionResult(success=False)
    try:
        result = executor.execute(command["prompt"], command["prompt_id"], command["extra_data"],
                                  lockstep.wrap(None), lockstep.agreed, command["outputs"])
    except RankFailed:  # another rank failed; rank 0 tells the client
        pass
    except Exception as exc:  # e.g. the prompt does not validate here (a file only rank 0 has)
        lockstep.report_failure(None, None, f"{full_type_name(type(exc))}: {exc}")
        result.error = {"exception_message": f"{full_type_name(type(exc))}: {exc}"}
    lockstep.finish(_outcome(result, lockstep.channel))
