"""The Ray Serve deployment: one lorabind executor per replica (one GPU each when the cluster has GPUs), running up
to ``--max-batch`` prompts at once through the replica's step engine, or with ``--parallel`` one group of N rank
actors per replica (``rank_group.py``; N GPUs, one placement group).

A replica keeps its models and their bound LoRAs between prompts, exactly like the single-machine worker.
``run`` streams ``lorabind_routed`` (the prompt reached this replica), ``lorabind_started`` (its turn came:
prompts for the binding the replica holds go first, ``scheduling.py``), the executor's events in order, then
one ``lorabind_result``. The front thereby knows where a prompt runs and which replica died if one does.
"""

from __future__ import annotations

import asyncio
import threading

from ray import serve

from ...loaders.placement.devices import set_session_defaults
from ..executor.engine_executors import EngineExecutors
from .interrupts import interrupt_board
from .prompt_run import private_folders, run_prompt
from .rank_group import RankGroup
from .scheduling import BindingFirstTurns

# One binding per replica: a replica's models hold one set of fused weights at a time, so a second fingerprint
# on the same replica would re-fuse anyway. Ray's multiplexing LRU then keeps each fingerprint on the replica
# that fused it, which is the affinity we want.
BINDINGS_PER_REPLICA = 1
INTERRUPT_POLL_S = 0.25


@serve.deployment(max_ongoing_requests=16)
class LorabindReplica:
    def __init__(self, node_classes: dict, models_root: str, input_dir: str, namespace: str, memory: str | None,
                 lora_dirs: tuple = (), parallel=None, rank_bundle: dict | None = None, max_batch: int = 1):
        # The front's --memory holds here too; the device stays "auto": the GPU Ray gave this replica.
        set_session_defaults(memory=memory)
        # The replica's Ray actor name (SERVE_REPLICA::lorabind#LorabindReplica#<tag>): what `ray kill` takes.
        self.replica = serve.get_replica_context().replica_id.to_full_id_str()
        # With --parallel the replica only coordinates: its ranks (``rank_group.py``) load and run the models.
        self.group = RankGroup(parallel, (node_classes, models_root, input_dir, memory, tuple(lora_dirs)),
                               rank_bundle or {}, name=self.replica, namespace=namespace
                               ) if parallel is not None and parallel.is_parallel else None
        if self.group is None:
            self.folders = private_folders(models_root, input_dir, lora_dirs, "lorabind-replica-")
            self.executor = EngineExecutors(node_classes, max_batch)  # the front's --max-batch, per replica
        self.board = interrupt_board(namespace)
        self.turns = BindingFirstTurns(max_batch if self.group is None else 1)

    @serve.multiplexed(max_num_models_per_replica=BINDINGS_PER_REPLICA)
    async def _binding(self, fingerprint: str) -> str:
        """What Ray's multiplexing tracks per replica. The weights themselves are bound by the sampler when
        the prompt runs (incrementally: nothing is written when the replica already holds this binding)."""
        return fingerprint

    async def run(self, prompt: dict, prompt_id: str, extra_data: dict, outputs: list):
        fingerprint = serve.get_multiplexed_model_id()
        if fingerprint:
            await self._binding(fingerprint)  # from here on Ray routes this fingerprint to this replica
        yield ["lorabind_routed", {"replica": self.replica, "prompt_id": prompt_id}]
        await self.turns.acquire(fingerprint)
        try:
            yield ["lorabind_started", {"replica": self.replica, "prompt_id": prompt_id}]
            async for event in self._execute(prompt, prompt_id, extra_data, outputs):
                yield event
        finally:
            await self.turns.release(fingerprint)

    async def _execute(self, prompt: dict, prompt_id: str, extra_data: dict, outputs: list):
        interrupt = threading.Event()
        if self.group is not None:
            watcher = asyncio.ensure_future(self._watch_interrupt(prompt_id, interrupt, self.group.interrupt))
            try:
                async for event in self.group.run(prompt, prompt_id, extra_data, outputs):
                    yield event
            finally:
                watcher.cancel()
            return
        loop = asyncio.get_running_loop()
        events: asyncio.Queue = asyncio.Queue()

        def execute() -> None:
            payload = run_prompt(self.executor, prompt, prompt_id, extra_data, outputs, self.folders,
                                 lambda name, data: loop.call_soon_threadsafe(events.put_nowait, [name, data]),
                                 interrupt)
            loop.call_soon_threadsafe(events.put_nowait, ["lorabind_result", payload])

        running = loop.run_in_executor(None, execute)
        watcher = asyncio.ensure_future(self._watch_interrupt(prompt_id, interrupt, lambda: None))
        try:
            while True:
                name, data = await events.get()
                yield [name, data]
                if name == "lorabind_result":
                    break
            await running
        finally:
            watcher.cancel()

    async def _watch_interrupt(self, prompt_id: str, interrupt: threading.Event, relay) -> None:
        """Poll the interrupt board while the prompt runs (events may stream without pause meanwhile); ``relay()``
        passes the interrupt on (to the ranks of a parallel replica). Cancelled when the prompt ends."""
        while True:
            if await self.board.is_interrupted.remote(prompt_id):
                interrupt.set()
                relay()
                return
            await asyncio.sleep(INTERRUPT_POLL_S)
