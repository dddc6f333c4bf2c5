"""The front's executor: runs a validated prompt on a replica chosen by its binding fingerprint.

It has ``PromptExecutor.execute``'s contract (events through ``on_event``, an ``ExecutionResult`` back), so the
server's queue, worker threads, history and WebSocket code are the same as on one machine. What it adds:
routing (``multiplexed_model_id`` = the fingerprint), files carried back from the replica, ``/interrupt``
relayed through the interrupt board, and a clear ``execution_error`` naming the replica when one dies.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from dataclasses import dataclass, field

from ..executor import ExecutionResult
from .fingerprint import binding_fingerprint
from .outputs import place_files, rename_in_ui

log = logging.getLogger("lorabind.server")

ROUTINGS = ("affinity", "round_robin")
# Prompts handed to each replica at once, so it can run the ones for the binding it holds first.
PROMPTS_IN_FLIGHT_PER_REPLICA = 4
# How long Ray Serve takes to tell every router that a replica now holds a multiplexed id (the replica pushes
# its ids every 0.1 s, then the controller broadcasts them).
ROUTER_SETTLE_S = 0.5


class ReplicaLostError(RuntimeError):
    """The replica running a prompt stopped (killed, out of memory, node lost) before the prompt finished."""


@dataclass
class ReplicaStats:
    prompts: int = 0
    fuses: int = 0  # prompts whose bind wrote or restored weights on this replica
    bound: str = ""  # the binding fingerprint of its last prompt
    fingerprints: dict = field(default_factory=dict)  # fingerprint -> prompts routed here


class RoutingState:
    """What each replica has bound and how many prompts went where (``GET /lorabind/routing``)."""

    def __init__(self, routing: str, replicas: int):
        self.routing, self.replicas = routing, replicas
        self._lock = threading.Lock()
        self._stats: dict[str, ReplicaStats] = {}
        self._running: dict[str, str] = {}  # prompt id -> replica running it
        self.lost: list[dict] = []

    def started(self, prompt_id: str, replica: str) -> None:
        with self._lock:
            self._running[prompt_id] = replica

    def finished(self, prompt_id: str) -> None:
        with self._lock:
            self._running.pop(prompt_id, None)

    def record(self, replica: str, fingerprint: str, fuses: int) -> None:
        with self._lock:
            stats = self._stats.setdefault(replica, ReplicaStats())
            stats.prompts += 1
            stats.fuses += 1 if fuses else 0
            stats.bound = fingerprint
            stats.fingerprints[fingerprint] = stats.fingerprints.get(fingerprint, 0) + 1

    def record_lost(self, replica: str, prompt_id: str) -> None:
        with self._lock:
            self.lost.append({"replica": replica, "prompt_id": prompt_id})

    def to_dict(self) -> dict:
        with self._lock:
            return {"mode": "ray", "routing": self.routing, "replicas_requested": self.replicas,
                    "replicas": {name: {"prompts": s.prompts, "fuses": s.fuses, "bound": s.bound,
                                        "fingerprints": dict(s.fingerprints)} for name, s in self._stats.items()},
                    "running": dict(self._running), "replicas_lost_mid_prompt": list(self.lost)}


class _FirstPlacements:
    """The first prompt of a binding goes out alone; later ones follow once Ray's routers know where it landed.

    Why: Ray routes by a multiplexed id only after the replica that loaded it has reported it. A burst of
    prompts for a new binding would otherwise be spread over replicas before any of them is known to hold it.
    """

    def __init__(self):
        self._lock = threading.Lock()
        self._placed: dict[str, threading.Event] = {}

    def claim(self, route: str) -> threading.Event | None:
        """The event to set once placed when this prompt is the binding's first; else wait for the first."""
        if not route:
            return None
        with self._lock:
            placed = self._placed.get(route)
            if placed is None:
                self._placed[route] = placed = threading.Event()
                return placed
        placed.wait(timeout=60.0)
        return None


class RayExecutor:
    def __init__(self, handle, board, node_classes: dict, folders: dict, *, replicas: int,
                 routing: str = "affinity"):
        if routing not in ROUTINGS:
            raise ValueError(f"routing must be one of {ROUTINGS}, got {routing!r}")
        self.handle, self.board, self.node_classes, self.folders = handle, board, node_classes, folders
        self.routing = routing
        self.state = RoutingState(routing, replicas)
        self._round_robin = itertools.count()
        self._replicas = replicas
        self._placements = _FirstPlacements()

    def reset_cache(self) -> None:
        """``POST /free`` on a cluster: replicas keep their models (they are released when Ray stops them)."""

    def routing_state(self) -> dict:
        return self.state.to_dict()

    def _route_id(self, prompt: dict) -> str:
        if self.routing == "round_robin":  # the comparison in bench/scale_out.py: prompt i -> replica i mod N
            return f"round-robin-{next(self._round_robin) % self._replicas}"
        return binding_fingerprint(prompt, self.node_classes)

    def execute(self, prompt: dict, prompt_id: str, extra_data: dict | None = None, on_event=None,
                interrupt_event: threading.Event | None = None, execute_outputs: list | None = None
                ) -> ExecutionResult:
        on_event = on_event or (lambda name, data: None)
        route = self._route_id(prompt)
        first_of_binding = self._placements.claim(route)
        relay = _InterruptRelay(self.board, prompt_id, interrupt_event)
        try:
            for attempt in (1, 2):
                try:
                    return self._run_once(route, prompt, prompt_id, extra_data or {}, execute_outputs, on_event,
                                          first_of_binding)
                except _NotStarted as exc:  # the router picked a replica that was already gone: nothing ran
                    if attempt == 2:
                        raise ReplicaLostError(f"no replica could take prompt {prompt_id}: {exc}") from None
                    log.warning("prompt %s: replica unavailable (%s); retrying on another replica", prompt_id, exc)
        finally:
            if first_of_binding is not None:
                first_of_binding.set()  # placed, or failed: either way the binding's other prompts may go
            relay.stop()
            self.state.finished(prompt_id)

    def _run_once(self, route, prompt, prompt_id, extra_data, execute_outputs, on_event,
                  first_of_binding: threading.Event | None) -> ExecutionResult:
        import ray.exceptions

        response = self.handle.options(multiplexed_model_id=route, stream=True).run.remote(
            prompt, prompt_id, extra_data, execute_outputs)
        replica, node, renamed, result = None, None, {}, None
        try:
            for name, data in response:
                if name == "lorabind_routed":
                    if first_of_binding is not None:
                        threading.Timer(ROUTER_SETTLE_S, first_of_binding.set).start()
                    continue
                if name == "lorabind_started":
                    replica = data["replica"]
                    self.state.started(prompt_id, replica)
                    log.info("prompt %s -> replica %s (%s)", prompt_id, replica, route or "no binding")
                    continue
                if name == "lorabind_result":
                    result = data
                    break
                if name == "executed":
                    renamed.update(place_files(data.pop("lorabind_files", []), self.folders))
                    data["output"] = rename_in_ui(data.get("output") or {}, renamed)
                elif name == "executing" and data.get("node") is not None:
                    node = data["node"]
                on_event(name, data)
        except (ray.exceptions.RayError, RuntimeError) as exc:
            if replica is None:
                raise _NotStarted(str(exc)) from exc
            self.state.record_lost(replica, prompt_id)
            return self._lost(replica, node, prompt_id, exc, on_event)
        if result is None:
            raise ReplicaLostError(f"replica {replica} ended prompt {prompt_id} without a result")
        if "failure" in result:
            raise RuntimeError(f"replica {replica}: {result['failure']}")
        self.state.record(replica, route, result["fuses"])
        log.info("prompt %s on replica %s: %s, %s", prompt_id, replica, "success" if result["success"] else "failed",
                 "fused" if result["fuses"] else "binding reused")
        outputs = {node_id: rename_in_ui(ui, renamed) for node_id, ui in result["outputs"].items()}
        return ExecutionResult(success=result["success"], outputs=outputs, executed=result["executed"],
                               cached=result["cached"], error=result["error"], interrupted=result["interrupted"],
                               messages=result["messages"], meta=result["meta"])

    def _lost(self, replica, node, prompt_id, exc, on_event) -> ExecutionResult:
        message = (f"replica {replica} stopped while running this prompt"
                   f"{f' (at node {node})' if node else ''}; the prompt did not finish, queue it again. "
                   f"Ray restarts the replica. ({type(exc).__name__})")
        log.error("prompt %s: %s", prompt_id, message)
        error = {"prompt_id": prompt_id, "node_id": node, "node_type": None, "executed": [],
                 "exception_message": message + "\n", "exception_type": ReplicaLostError.__name__,
                 "traceback": [], "current_inputs": {}, "current_outputs": [], "timestamp": int(time.time() * 1000)}
        on_event("execution_error", error)
        return ExecutionResult(success=False, error=error, messages=[["execution_error", error]])


class _NotStarted(Exception):
    """The call failed before any replica accepted the prompt (safe to retry: nothing ran)."""


class _InterruptRelay:
    """Marks the prompt on the interrupt board as soon as the worker's interrupt event is set."""

    def __init__(self, board, prompt_id: str, event: threading.Event | None):
        self.board, self.prompt_id, self.event = board, prompt_id, event
        self._done = threading.Event()
        self._thread = None
        if event is not None:
            self._thread = threading.Thread(target=self._watch, name="lorabind-interrupt-relay", daemon=True)
            self._thread.start()

    def _watch(self) -> None:
        while not self._done.is_set():
            if self.event.wait(0.1):
                self.board.interrupt.remote(self.prompt_id)
                return

    def stop(self) -> None:
        self._done.set()
        if self._thread is not None:
            self._thread.join()
        self.board.forget.remote(self.prompt_id)
