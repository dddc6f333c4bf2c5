"""The Ray Serve deployment: one lorabind executor per replica (one GPU each when the cluster has GPUs).

A replica keeps its models and their bound LoRAs between prompts, exactly like the single-machine worker.
``run`` streams ``lorabind_routed`` (the prompt reached this replica), ``lorabind_started`` (its turn came:
prompts for the binding the replica holds go first, ``scheduling.py``), the executor's events in order, then
one ``lorabind_result``. The front thereby knows where a prompt runs and which replica died if one does.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
import threading

from ray import serve

from ...loaders.models import store as model_store
from ...loaders.placement.devices import set_session_defaults
from .. import folder_paths
from ..executor import PromptExecutor
from .interrupts import interrupt_board
from .outputs import take_files
from .scheduling import BindingFirstTurns

# One binding per replica: a replica's models hold one set of fused weights at a time, so a second fingerprint
# on the same replica would re-fuse anyway. Ray's multiplexing LRU then keeps each fingerprint on the replica
# that fused it, which is the affinity we want.
BINDINGS_PER_REPLICA = 1
INTERRUPT_POLL_S = 0.25


def _fuse_passes() -> int:
    """Binds that wrote or restored weights, over every model this replica has loaded."""
    return sum(model.binding_state.stats.fuse_passes for model in model_store.loaded_models()
               if model.binding_state is not None)


@serve.deployment(max_ongoing_requests=16)
class LorabindReplica:
    def __init__(self, node_classes: dict, models_root: str, input_dir: str, namespace: str, memory: str | None,
                 lora_dirs: tuple = ()):
        # The front's --memory holds here too; the device stays "auto": the GPU Ray gave this replica.
        set_session_defaults(memory=memory)

        work = tempfile.mkdtemp(prefix="lorabind-replica-")
        self.folders = {"output": os.path.join(work, "output"), "temp": os.path.join(work, "temp")}
        folder_paths.configure(models_root=models_root, output_dir=self.folders["output"], input_dir=input_dir,
                               temp_dir=self.folders["temp"])
        for folder in lora_dirs:  # the front's --allow-lora-dir folders (the same paths on every node)
            folder_paths.add_model_folder_path("loras", folder)
        self.executor = PromptExecutor(node_classes)
        # The replica's Ray actor name (SERVE_REPLICA::lorabind#LorabindReplica#<tag>): what `ray kill` takes.
        self.replica = serve.get_replica_context().replica_id.to_full_id_str()
        self.board = interrupt_board(namespace)
        self.turns = BindingFirstTurns()

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
        loop = asyncio.get_running_loop()
        events: asyncio.Queue = asyncio.Queue()
        interrupt = threading.Event()

        def on_event(name: str, data: dict) -> None:
            if name == "executed":  # carry the files this node wrote (the front has its own output folder)
                data = {**data, "lorabind_files": take_files(data.get("output"), self.folders)}
            loop.call_soon_threadsafe(events.put_nowait, [name, data])

        def execute() -> None:
            before = _fuse_passes()
            try:
                result = self.executor.execute(prompt, prompt_id, extra_data=extra_data, on_event=on_event,
                                               interrupt_event=interrupt, execute_outputs=outputs)
                payload = {"success": result.success, "outputs": result.outputs, "messages": result.messages,
                           "meta": result.meta, "error": result.error, "interrupted": result.interrupted,
                           "executed": result.executed, "cached": result.cached}
            except Exception as exc:  # e.g. a file removed since the front validated: reported, not raised
                payload = {"failure": f"{type(exc).__name__}: {exc}"}
            payload["fuses"] = _fuse_passes() - before
            loop.call_soon_threadsafe(events.put_nowait, ["lorabind_result", payload])

        running = loop.run_in_executor(None, execute)
        watcher = asyncio.ensure_future(self._watch_interrupt(prompt_id, interrupt, running))
        try:
            while True:
                name, data = await events.get()
                yield [name, data]
                if name == "lorabind_result":
                    break
            await running
        finally:
            watcher.cancel()

    async def _watch_interrupt(self, prompt_id: str, interrupt: threading.Event, running) -> None:
        """Poll the interrupt board while the prompt runs (events may stream without pause meanwhile)."""
        while not running.done():
            if await self.board.is_interrupted.remote(prompt_id):
                interrupt.set()
                return
            await asyncio.sleep(INTERRUPT_POLL_S)
