"""One rank of a ``serve --ray --parallel`` replica: a Ray actor that joins its group's ``torch.distributed`` job
and executes every prompt SPMD with the other ranks.

Why an actor per rank, not a process per rank under the replica: Ray places each rank on its own GPU (a bundle of
the replica's placement group) and can place them on other nodes; the replica only coordinates. The rank does what
a rank of ``lorabind serve --parallel`` does (``runtime.parallel.ranks.rank_of_job`` joins the job the same way,
and the prompt runs on the one rank protocol: nodes in lockstep, steps as rank 0's step engine plans them); rank 0
streams its events and files to the replica, the others answer only with their result (their files are dropped,
as an unseen rank's scratch folder is on the command line).
"""

from __future__ import annotations

import contextlib
import os
import queue
import threading

import ray
import torch.distributed as dist

from ...loaders.distributed.process_group import DEFAULT_TIMEOUT_S
from ...loaders.distributed.spec import ParallelSpec
from ...loaders.models import store as model_store
from ...loaders.placement.devices import set_session_defaults
from ..executor.engine_executors import EngineExecutors
from ..parallel.job_environment import interface_holding, job_environment
from ..parallel.launch import free_port
from ..parallel.plan_stream import StorePlans
from ..parallel.prompt_channel import Lockstep, PromptChannel
from ..parallel.ranks import bound_alike, rank_of_job
from .prompt_run import private_folders, run_prompt

JOIN_RENDEZVOUS_S = 60.0  # rank 0's actor starts the store as the others reach for it: all join at once

# Two calls at once: a prompt runs in one, ``interrupt`` arrives in the other.
@ray.remote(max_concurrency=2)
class RankActor:
    def __init__(self, rank: int, spec: ParallelSpec, node_classes: dict, models_root: str, input_dir: str,
                 memory: str | None, lora_dirs: tuple = ()):
        set_session_defaults(memory=memory)  # the device stays "auto": the GPU of this rank's bundle
        self.rank, self.spec = rank, spec
        self.folders = private_folders(models_root, input_dir, lora_dirs, f"lorabind-rank{rank}-")
        self.node_classes = node_classes
        self.executor = self.channel = None  # made once the group is joined: they run on the group's store
        self.interrupted = threading.Event()  # rank 0's: the replica's /interrupt relay
        self._job = contextlib.ExitStack()

    def rendezvous(self) -> tuple[str, int]:
        """Rank 0's address and a free port on its node: where the group's store listens."""
        return ray.util.get_node_ip_address(), free_port()

    def join(self, address: str, port: int, secret: str) -> int:
        """Join the group (every rank at once: this returns when all have joined, or fails at the timeout).
        Rank 0 hosts the group's store on ``address`` (its node's), every rank signs with the group's ``secret``."""
        # torchrun's variables, as our own launcher sets them; Ray shows each rank only its bundle's GPU, so the
        # local rank is 0 on every one. The ranks may sit on other nodes: each listens on its node's interface.
        own = ray.util.get_node_ip_address()
        os.environ.update(MASTER_ADDR=address, MASTER_PORT=str(port), RANK=str(self.rank),
                          WORLD_SIZE=str(self.spec.world_size), LOCAL_RANK="0",
                          LOCAL_WORLD_SIZE=str(self.spec.world_size), LORABIND_JOB_SECRET=secret,
                          LORABIND_RENDEZVOUS_TIMEOUT_S=str(JOIN_RENDEZVOUS_S))
        interface = interface_holding(own)
        if interface is not None:
            os.environ["LORABIND_PARALLEL_INTERFACE"] = interface
        joined = self._job.enter_context(rank_of_job(self.spec, job_environment()))
        # the one rank protocol, as serve --parallel's ranks run it: nodes met in lockstep, steps as rank 0's step
        # engine plans them (so an interrupt or a failure stops every rank at the same point)
        self.channel = PromptChannel(joined.store, joined.rank, joined.world_size, DEFAULT_TIMEOUT_S)
        self.executor = EngineExecutors(self.node_classes, 1, leads=joined.rank == 0, after_bind=bound_alike,
                                        plans=StorePlans(joined.store.connection(), joined.rank, joined.world_size))
        return joined.rank

    def run(self, prompt: dict, prompt_id: str, extra_data: dict, outputs: list, number: int):
        """Stream ``[name, data]`` events (rank 0 only), then one ``["lorabind_result", payload]``. ``number``: the
        prompt's place in the group's sequence (its lockstep keys, the same on every rank)."""
        self.interrupted.clear()
        lockstep = Lockstep(self.channel, number, self.interrupted)
        if self.rank != 0:
            yield ["lorabind_result", self._settled(run_prompt(
                self.executor, prompt, prompt_id, extra_data, outputs, self.folders, lambda name, data: None,
                lockstep.interrupt, lockstep), lockstep)]
            return
        events: queue.Queue = queue.Queue()

        def execute() -> None:
            payload = self._settled(run_prompt(self.executor, prompt, prompt_id, extra_data, outputs, self.folders,
                                               lambda name, data: events.put([name, data]), lockstep.interrupt,
                                               lockstep), lockstep)
            lockstep.outcomes()  # every rank done with the prompt: its keys go
            lockstep.forget(number)
            events.put(["lorabind_result", payload])

        threading.Thread(target=execute, name="lorabind-rank-prompt", daemon=True).start()
        while True:
            event = events.get()
            yield event
            if event[0] == "lorabind_result":
                return

    def _settled(self, payload: dict, lockstep) -> dict:
        """Tell the other ranks how the prompt ended (rank 0's interrupt stops one still at a node's start), and
        after a failure drop the cached outputs: a rank that failed ran fewer nodes than the others."""
        success, interrupted = bool(payload.get("success")), bool(payload.get("interrupted"))
        lockstep.finish({"success": success, "interrupted": interrupted})
        if not (success or interrupted):
            self.executor.reset_cache()
        return payload

    def interrupt(self) -> None:
        self.interrupted.set()

    def describe(self) -> dict:
        """This rank's place in its group and the loaded components split over the group (an operator's
        ``ray.get_actor(name).describe.remote()``; the tests' proof that a replica really splits its model)."""
        split = sorted(name for model in model_store.loaded_models() for name, module in model.components.items()
                       if getattr(module, "_parallel_config", None) is not None)
        return {"rank": dist.get_rank() if dist.is_initialized() else None,
                "world_size": dist.get_world_size() if dist.is_initialized() else None, "split": split}
