"""``lorabind serve --parallel``: rank 0 serves HTTP and WebSocket as a plain server does; the other ranks serve
nobody and run what rank 0 hands them, so every prompt executes SPMD on all ranks (each rank takes part in
each split step).

The seam is the worker's executor: on rank 0 it is ``RankZeroExecutor``, which sends each prompt down the
``PromptChannel`` before running it here in lockstep with the other ranks, and merges their outcomes into the
one result the worker records. Everything before the queue (validation, the contract check) happens once, on rank
0, before any rank loads or binds anything for the prompt, so a refusal reaches the client as it does today.
What leaves rank 0 is the prompt without the comfy.org tokens (``SENSITIVE_EXTRA_DATA_KEYS``): the other ranks
run none of the nodes that use them, and the store they travel through is signed, not secret.

Outside torchrun this process is rank 0 and starts the others itself (``ServedRanks``), so when one dies or
stalls the prompt fails naming it, and the next prompt finds the ranks started again, the queue untouched.
"""

from __future__ import annotations

import gc
import os
import signal
import sys
import threading
import time

from ...loaders.distributed.process_group import ParallelRunError
from ...loaders.models import store as model_store
from ..core_nodes import runtime_node_classes
from ..executor.definitions import full_type_name
from ..executor.engine_executors import EngineExecutors
from ..executor.execution import ExecutionResult
from ..parallel.job_environment import job_environment
from ..parallel.launch import LaunchStopped, stopped_by_signals
from ..parallel.outcomes import fail_as, outcome
from ..parallel.prompt_channel import Lockstep, RankFailed
from ..parallel.ranks import bound_alike
from ..parallel.served_ranks import ServedRanks, supervising
from .app import run_server
from .history import SENSITIVE_EXTRA_DATA_KEYS
from .parallel_follower import follow
from .parallel_validation import ParallelValidator

RECORD_GRACE_S = 1.0  # after the last prompt's execute: the worker writes its history entry and tells its client
LOST_PROMPTS_END_S = 60.0  # a lost rank fails the other prompts in flight at once; bounded all the same


def serve_job(config, spec, argv: list[str], *, listeners=None, interface: str | None = None,
              rank_timeout_s: float) -> int:
    """Outside a job: this process is rank 0 and starts the others (each runs this command again). Inside one
    (torchrun's, or ours): serve as rank 0, or follow rank 0. ``listeners``: rank 0's HTTP sockets, bound first."""
    ranks, job = None, None
    try:
        job = job_environment(interface)
        if job is not None and job.rank != 0:
            return follow(config, spec, job)
        if job is None:
            print(f"lorabind serve: --parallel {spec.describe()}: starting {spec.world_size} ranks", flush=True)
            ranks = supervising(spec, argv, interface, rank_timeout_s)
        else:
            ranks = ServedRanks(spec, job, rank_timeout_s)
        with stopped_by_signals():  # a Ctrl-C while the ranks meet stops them, quietly
            ranks.start()
    except LaunchStopped as stopped:
        ranks.stop()
        return stopped.exit_code
    except ParallelRunError as exc:
        print(f"lorabind serve: {f'rank {job.rank}: ' if job is not None else ''}{exc}",
              file=sys.stdout if job is None or job.rank == 0 else sys.stderr)
        if ranks is not None:
            ranks.stop()
        return 2
    engine_executors = EngineExecutors(runtime_node_classes()[0], config.max_batch, plans=ranks.plans,
                                       after_bind=bound_alike)
    executor = RankZeroExecutor(engine_executors, ranks)
    # No template thumbnails: rendering one is a prompt, which here would have to be one of the job's prompts (a
    # plain `lorabind serve` renders them once into the state folder, where this server finds them).
    run_server(config, executor=executor, validator=ParallelValidator(runtime_node_classes()[0], spec),
               unload_models=executor.unload_models, render_thumbnails=False, listeners=listeners,
               on_stopped=executor.stop)
    return 0


class RankZeroExecutor:
    """The worker's executor on rank 0: each prompt goes to every rank, then runs here in lockstep with them; its
    result fails when any rank failed, naming the rank. ``/free`` reaches every rank through ``reset_cache`` and
    ``unload_models``. A rank lost during a prompt fails it naming the rank; the next prompt starts the ranks
    again first (or, ranks torchrun started, the server stops: it cannot serve without them)."""

    def __init__(self, local, ranks: ServedRanks):
        self.local, self.ranks = local, ranks
        self.concurrency = local.concurrency  # the worker's threads: --max-batch prompts in flight on every rank
        self.given_up: str | None = None
        self._flight = threading.Condition()
        self._running = 0  # prompts in execute (the server may stop without cutting one off)
        self._restarting = threading.Lock()

    def reset_cache(self) -> None:
        if self.ranks.lost() is None:
            self.ranks.channel.send({"kind": "free", "unload": False})
        self.local.reset_cache()

    def unload_models(self) -> None:
        if self.ranks.lost() is None:
            self.ranks.channel.send({"kind": "free", "unload": True})
        model_store.clear_cache()

    def stop(self) -> int:
        """After the server stopped: stop the other ranks; the exit code (1 when the job gave up on its ranks)."""
        code = self.ranks.stop()
        return 1 if self.given_up else code

    def execute(self, prompt: dict, prompt_id: str, extra_data: dict | None = None, on_event=None,
                interrupt_event: threading.Event | None = None, execute_outputs: list | None = None
                ) -> ExecutionResult:
        with self._flight:
            self._running += 1
        try:
            return self._execute(prompt, prompt_id, extra_data, on_event, interrupt_event, execute_outputs)
        finally:
            with self._flight:
                self._running -= 1
                self._flight.notify_all()

    def _execute(self, prompt, prompt_id, extra_data, on_event, interrupt_event, execute_outputs) -> ExecutionResult:
        result = ExecutionResult(success=False)
        not_ready = self._ready()
        if not_ready:
            fail_as(result, prompt_id, {"error": not_ready}, on_event)
            return result
        requested = interrupt_event if interrupt_event is not None else threading.Event()
        requested.clear()  # as the executor does: an interrupt sent before the prompt starts is not for it
        slot = self.local.slot()  # the other ranks run it on the same slot: the same cached outputs
        number = self.ranks.channel.send({"kind": "prompt", "prompt": prompt, "prompt_id": prompt_id,
                                          "extra_data": for_other_ranks(extra_data),
                                          "outputs": execute_outputs, "slot": slot})
        lockstep = Lockstep(self.ranks.channel, number, requested)
        raised = None
        try:
            result = self.local.execute(prompt, prompt_id, extra_data, self._naming_lost(on_event),
                                        lockstep.interrupt, execute_outputs, sync=lockstep, slot=slot)
        except RankFailed as exc:  # another rank failed before this one started a node: fail where it failed
            fail_as(result, prompt_id, {"error": str(exc), "node_id": exc.node_id, "node_type": exc.node_type},
                  on_event)
        except Exception as exc:  # e.g. the prompt no longer validates: the others stop at their next sync point
            lockstep.report_failure(None, None, f"{full_type_name(type(exc))}: {exc}")
            raised = exc
        lockstep.finish(outcome(result))
        others = lockstep.outcomes()
        lockstep.forget(number)
        if self.ranks.lost() is not None:
            return self._lost_during(result, prompt_id, on_event)
        if not all(o["success"] or o["interrupted"] for o in [outcome(result), *others.values()]):
            self.reset_cache()  # a rank that failed ran fewer nodes: no rank keeps outputs the others lack
        if raised is not None:
            raise raised
        late = [o for o in others.values() if not (o["success"] or o["interrupted"])]
        if result.success and late:  # a rank failed after the last sync point (a decode, a saver)
            fail_as(result, prompt_id, late[0], on_event)
        return result

    def _ready(self) -> str | None:
        """None when the ranks can take a prompt, starting them again first after a loss (once the prompts that
        were in flight with it have failed); else why not."""
        with self._restarting:
            if self.given_up or self.ranks.lost() is None:
                return self.given_up
            with self._flight:
                self._flight.wait_for(lambda: self._running == 1, timeout=LOST_PROMPTS_END_S)
            return self._restart()

    def _restart(self) -> str | None:
        self.local.reset_cache()
        model_store.clear_cache()  # the loaded models are split over the old group
        gc.collect()
        try:
            self.ranks.restart()
        except ParallelRunError as exc:
            self._give_up(f"the job could not start its ranks again: {exc}")
            return self.given_up
        self.local.engine.lead_with(self.ranks.plans)
        print(f"lorabind serve: the job's {self.ranks.spec.world_size} ranks started again (generation "
              f"{self.ranks.generation})", file=sys.stderr, flush=True)
        return None

    def _naming_lost(self, on_event):
        """An execution error here while a rank is lost is that loss (a collective whose peer is gone): the
        client is told which rank, not the transport's words."""
        def reporting(name: str, data: dict) -> None:
            reason = self.ranks.wait_lost() if name == "execution_error" else None
            if reason is not None:
                data = {**data, "exception_message": f"{self._loss_text(reason)}\n",
                        "exception_type": full_type_name(RankFailed)}
            if on_event is not None:
                on_event(name, data)
        return reporting

    def _lost_during(self, result: ExecutionResult, prompt_id: str, on_event) -> ExecutionResult:
        """The prompt's result when a rank was lost during it: failed, naming the rank (the client has had its
        execution_error already when the failure surfaced here as one)."""
        failed = ExecutionResult(success=False, executed=list(result.executed))
        fail_as(failed, prompt_id, {"error": self._loss_text(self.ranks.lost()), "node_id": (result.error or {}).get(
            "node_id"), "node_type": (result.error or {}).get("node_type")}, on_event if result.error is None else None)
        self.local.reset_cache()
        if not self.ranks.can_restart:
            self._give_up(self.ranks.lost())
        return failed

    def _loss_text(self, reason: str) -> str:
        then = ("the job starts its ranks again for the next prompt (queued prompts are kept)"
                if self.ranks.can_restart else "ranks started by torchrun cannot be started again by the job, so "
                "the server stops (torchrun --max-restarts starts the whole job again)")
        return f"{reason} during this prompt; {then}"

    def _give_up(self, reason: str) -> None:
        """Stop saying healthy: once this prompt is recorded, the server shuts down as on SIGTERM."""
        self.given_up = reason
        print(f"lorabind serve: {reason}; stopping", file=sys.stderr, flush=True)
        threading.Thread(target=self._stop_after_this_prompt, name="lorabind-give-up", daemon=True).start()

    def _stop_after_this_prompt(self) -> None:
        with self._flight:  # every execute has returned: the worker records the history and tells the client
            self._flight.wait_for(lambda: self._running == 0)
        time.sleep(RECORD_GRACE_S)
        os.kill(os.getpid(), signal.SIGTERM)


def for_other_ranks(extra_data: dict | None) -> dict:
    """What the other ranks get of a prompt's ``extra_data``: all but the comfy.org tokens (the queue item's
    sensitive part), which stay on rank 0."""
    return {key: value for key, value in (extra_data or {}).items() if key not in SENSITIVE_EXTRA_DATA_KEYS}
