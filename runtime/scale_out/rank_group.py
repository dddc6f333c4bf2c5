"""A ``serve --ray --parallel`` replica's group of N rank actors: started in the replica's placement group, run
each prompt SPMD, answer with rank 0's result, and torn down when its ranks stop agreeing.

Why torn down rather than repaired: a rank that failed or stopped between two collectives leaves the others
blocked in the next one, and their process group cannot be trusted again. Killing the actors ends those waits at
once (no rank sits out the group's 10-minute collective timeout); the next prompt starts a fresh group, which loads
the models again. Every wait here is bounded: the rendezvous (``JOIN_TIMEOUT_S``) and, once one rank has answered,
the others (``SETTLE_S``, or ``FAILED_SETTLE_S`` after a failure).
"""

from __future__ import annotations

import asyncio
import logging

import ray
from ray.util.placement_group import get_current_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from ..parallel.launch import new_secret
from ..parallel.options import refusal
from ..parallel.prompt_channel import RankFailed
from .rank_actor import RankActor

log = logging.getLogger("lorabind.server")

JOIN_TIMEOUT_S = 180.0  # every rank's actor started (imports torch and the nodes) and joined the group
SETTLE_S = 60.0  # after one rank's result, how long the others may take (their last step, decode and save)
FAILED_SETTLE_S = 5.0  # after a rank failed or stopped on an interrupt: ranks that stop alike answer within this
# Rank 0's closing events wait for the other ranks: when rank 0 failed only because another rank died, the client
# gets the group's answer naming that rank, not rank 0's broken collective as a second error.
CLOSING_EVENTS = ("execution_success", "execution_error", "execution_interrupted")


class RankGroupError(RuntimeError):
    """The group could not start (no rendezvous, or a rank that could not join within the bound)."""


def _failure_of(result: dict) -> str | None:
    """Why a rank's result is a failure (None: it succeeded or was interrupted)."""
    if "failure" in result:
        return result["failure"]
    if result.get("success") or result.get("interrupted"):
        return None
    error = result.get("error") or {}
    return (f"node {error.get('node_id')} ({error.get('node_type')}) failed: {error.get('exception_type')}: "
            f"{str(error.get('exception_message', '')).strip()}")


def _same_outcome(results: list[dict]) -> bool:
    """Every rank ended the prompt alike: all succeeded, all interrupted, or all failed, the others stopped by the
    one that failed (the one rank protocol stops them at their next node, before any collective it would miss)."""
    def outcome(result: dict):
        return bool(result.get("success")), bool(result.get("interrupted"))
    broken = any("failure" in result and not _stopped_by_peer(result) for result in results)  # outside any node
    return len({outcome(result) for result in results}) == 1 and not broken


def _stopped_by_peer(result: dict) -> bool:
    return str(result.get("failure", "")).startswith(RankFailed.__name__)


def settle(results: dict[int, dict], world: int, waited_s: float) -> tuple[dict, bool]:
    """(the replica's answer, whether the group may run the next prompt) from the ranks that answered.

    The group is kept only when every rank answered with the same outcome: otherwise a rank may be blocked in a
    collective, or its cached outputs differ from the others'. The answer is rank 0's result when the ranks agree,
    else a failure naming the first rank that failed (or did not answer within ``waited_s``)."""
    if len(results) == world and _same_outcome([results[rank] for rank in range(world)]):
        return results[0], True
    # a rank whose actor died first: the others' failures are then its consequence (a collective cut off)
    failed = sorted((not result.get("lost"), rank, text) for rank, result in results.items()
                    if (text := _failure_of(result)))
    if not failed:
        missing = [rank for rank in range(world) if rank not in results]
        if 0 in results and results[0].get("interrupted"):
            return results[0], False  # interrupted: the ranks that stopped later are cut off
        failed = [(True, missing[0], f"did not finish within {waited_s:g} s of the other ranks")] if missing else \
            [(True, 0, "the ranks ended the prompt differently")]
    _, rank, text = failed[0]
    return {"failure": f"rank {rank} of {world}: {text} (the replica's {world} ranks are restarted for the next "
                       f"prompt)", "fuses": results.get(0, {}).get("fuses", 0)}, False


class RankGroup:
    """Started on the first prompt (and again after a teardown); ``actor_args`` are ``RankActor``'s after the rank
    and spec; ``bundle`` is one rank's share of the placement group ({"GPU": 1} or {"CPU": n}). Each start is a
    new generation; rank r's actor is named ``<name>#g<generation>#rank<r>`` in ``namespace`` (what ``ray kill``
    takes)."""

    def __init__(self, spec, actor_args: tuple, bundle: dict, *, name: str, namespace: str):
        if refusal(spec):  # the front refuses these before deploying; a replica never builds a group it cannot run
            raise RankGroupError(refusal(spec))
        self.spec, self.actor_args, self.bundle = spec, actor_args, bundle
        self.name, self.namespace = name, namespace
        self.generation = 0
        self.actors: list = []
        self.prompts = 0  # the prompt's number in this group: its lockstep keys, the same on every rank

    async def start(self) -> None:
        group = get_current_placement_group()  # the replica's own: one bundle per rank (``cluster.py``)
        self.generation, self.prompts = self.generation + 1, 0
        options = {"num_cpus": self.bundle.get("CPU", 0), "num_gpus": self.bundle.get("GPU", 0),
                   "namespace": self.namespace}
        self.actors = [RankActor.options(**options, **_in_bundle(group, rank),
                                         name=f"{self.name}#g{self.generation}#rank{rank}").remote(
            rank, self.spec, *self.actor_args) for rank in range(self.spec.world_size)]
        try:
            address, port = await asyncio.wait_for(self.actors[0].rendezvous.remote(), JOIN_TIMEOUT_S)
            secret = new_secret()  # the group's own, handed to its actors through Ray (never a command line)
            await asyncio.wait_for(asyncio.gather(*(actor.join.remote(address, port, secret)
                                                    for actor in self.actors)), JOIN_TIMEOUT_S)
        except Exception as exc:
            self.stop()
            raise RankGroupError(f"the replica's {self.spec.world_size} ranks (--parallel {self.spec.describe()}) "
                                 f"could not form their group within {JOIN_TIMEOUT_S:g} s: {type(exc).__name__}: "
                                 f"{exc}") from exc
        log.info("replica group of %d ranks joined at %s:%d", len(self.actors), address, port)

    def interrupt(self) -> None:
        """Rank 0 only: it leads, and the one rank protocol stops every other rank where it stopped."""
        if self.actors:
            self.actors[0].interrupt.remote()

    def stop(self) -> None:
        """Kill the rank actors (a rank blocked in a collective is ended, not waited for)."""
        actors, self.actors = self.actors, []
        for actor in actors:
            ray.kill(actor, no_restart=True)

    async def run(self, prompt: dict, prompt_id: str, extra_data: dict, outputs: list):
        """Rank 0's events, then one ``["lorabind_result", payload]`` settled over every rank."""
        if not self.actors:
            try:
                await self.start()
            except RankGroupError as exc:
                yield ["lorabind_result", {"failure": str(exc), "fuses": 0}]
                return
        answers: asyncio.Queue = asyncio.Queue()
        self.prompts += 1
        pumps = [asyncio.ensure_future(_pump(rank, actor.run.options(num_returns="streaming").remote(
            prompt, prompt_id, extra_data, outputs, self.prompts), answers)) for rank, actor in enumerate(self.actors)]
        results: dict[int, dict] = {}
        closing: list = []
        waited, loop = 0.0, asyncio.get_running_loop()
        deadline = None
        try:
            while len(results) < len(self.actors):
                try:
                    rank, (name, data) = await asyncio.wait_for(
                        answers.get(), None if deadline is None else max(0.0, deadline - loop.time()))
                except asyncio.TimeoutError:
                    break
                if name in CLOSING_EVENTS:
                    closing.append([name, data])
                    continue
                if name != "lorabind_result":
                    yield [name, data]
                    continue
                results[rank] = data
                settle_s = SETTLE_S if data.get("success") else FAILED_SETTLE_S
                if deadline is None or loop.time() + settle_s < deadline:
                    deadline, waited = loop.time() + settle_s, settle_s
        finally:
            for pump in pumps:
                pump.cancel()
        answer, keep = settle(results, len(self.actors), waited)
        if not keep:
            log.warning("prompt %s: tearing down the replica's group: %s", prompt_id,
                        answer.get("failure", "interrupted"))
            self.stop()
        for event in closing if "failure" not in answer else ():
            yield event
        yield ["lorabind_result", answer]


async def _pump(rank: int, stream, answers: asyncio.Queue) -> None:
    """One rank's events into ``answers``; a rank whose actor died answers with a failure naming the cause."""
    try:
        async for ref in stream:
            await answers.put((rank, await ref))
    except asyncio.CancelledError:
        raise
    except Exception as exc:  # the actor died (killed, out of memory, node lost) or the call could not run
        cause = str(exc).splitlines()[0] if str(exc) else ""
        await answers.put((rank, ["lorabind_result", {"failure": f"its actor stopped ({type(exc).__name__}: {cause})",
                                                      "lost": True}]))


def _in_bundle(group, rank: int) -> dict:
    """Rank ``rank`` in bundle ``rank`` of the replica's placement group (none outside one: Ray places it)."""
    if group is None:
        return {}
    return {"scheduling_strategy": PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=rank)}
