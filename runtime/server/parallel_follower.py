"""A rank other than 0 of ``lorabind serve --parallel``: it serves nobody and runs what rank 0 hands it, up to
``--max-batch`` prompts at once (each on a thread of its own, as rank 0's worker runs them), their nodes in
lockstep with rank 0's (``Lockstep``) and their denoising steps in the forwards rank 0's step engine decides
(``plan_stream``). Its files go to a scratch folder; rank 0's copy is the one the user gets.
"""

from __future__ import annotations

import concurrent.futures
import gc
import os
import signal

import torch

from ...loaders.distributed.process_group import DEFAULT_TIMEOUT_S, ParallelRunError, leave_job
from ...loaders.models import store as model_store
from .. import folder_paths
from ..core_nodes import runtime_node_classes
from ..executor.definitions import full_type_name
from ..executor.engine_executors import EngineExecutors
from ..executor.execution import ExecutionResult
from ..parallel.liveness import Heartbeat
from ..parallel.outcomes import outcome
from ..parallel.plan_stream import StorePlans
from ..parallel.prompt_channel import Lockstep, PromptChannel, RankFailed
from ..parallel.ranks import bound_alike, rank_of_job, unseen_rank
from ..parallel.served_ranks import GENERATION_VARIABLE


def follow(config, spec, job) -> int:
    """A rank other than 0: meet rank 0 in the generation it was started for, beat a heartbeat, run what rank 0
    sends until it says stop (or its store closes). SIGINT and SIGTERM end it quietly with 0."""
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, _exit_quietly)
    generation = os.environ.get(GENERATION_VARIABLE, "1")
    if not (generation.isascii() and generation.isdigit()):
        raise ParallelRunError(f"{GENERATION_VARIABLE}={generation[:20]!r} is not a whole number")
    with rank_of_job(spec, job, namespace=f"g{generation}") as joined:
        heartbeat = Heartbeat(joined.store.connection(), joined.rank).start()
        plans = StorePlans(joined.store.connection(), joined.rank, joined.world_size)
        with unseen_rank() as (scratch, _null):
            follow_rank_zero(config, PromptChannel(joined.store, joined.rank, joined.world_size, DEFAULT_TIMEOUT_S),
                             plans, scratch)
        heartbeat.stop()
        leave_job()  # rank 0 said stop with nothing in flight: no barrier to wait at
    return 0


def _exit_quietly(_signum, _frame):
    raise SystemExit(0)


def follow_rank_zero(config, channel: PromptChannel, plans: StorePlans, scratch: str) -> int:
    """A rank other than 0: run each prompt rank 0 sends (its files go to ``scratch``), up to ``--max-batch`` at
    once, its steps as rank 0's engine plans them, until rank 0 stops."""
    config = config.resolved()
    folder_paths.configure(models_root=config.models_root, output_dir=scratch, input_dir=config.input_dir,
                           temp_dir=scratch)
    for folder in config.lora_dirs:
        folder_paths.add_model_folder_path("loras", folder)
    executors = EngineExecutors(runtime_node_classes()[0], config.max_batch, plans=plans, leads=False,
                                after_bind=bound_alike)
    running: set = set()
    with concurrent.futures.ThreadPoolExecutor(config.max_batch, thread_name_prefix="lorabind-follow") as pool:
        while (received := channel.receive()) is not None:
            number, command = received
            if command["kind"] == "free":  # rank 0 frees only between prompts: ours end first
                concurrent.futures.wait(running)
                _free(executors, command["unload"])
            elif command["kind"] == "prompt":
                running = {f for f in running if not f.done()}
                running.add(pool.submit(_run_followed, executors, Lockstep(channel, number), command))
    executors.close()
    return 0


def _free(executors, unload: bool) -> None:
    executors.reset_cache()
    if unload:
        model_store.clear_cache()
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def _run_followed(executor, lockstep: Lockstep, command: dict) -> None:
    result = ExecutionResult(success=False)
    try:
        result = executor.execute(command["prompt"], command["prompt_id"], command["extra_data"], None,
                                  lockstep.interrupt, command["outputs"], sync=lockstep, slot=command["slot"])
    except RankFailed:  # another rank failed; rank 0 tells the client
        pass
    except Exception as exc:  # e.g. the prompt does not validate here (a file only rank 0 has)
        lockstep.report_failure(None, None, f"{full_type_name(type(exc))}: {exc}")
        result.error = {"exception_message": f"{full_type_name(type(exc))}: {exc}"}
    lockstep.finish(outcome(result, lockstep.channel))
