"""Connect to (or start) a Ray cluster and deploy the lorabind replicas behind Ray Serve."""

from __future__ import annotations

import logging
import os

from ...loaders.placement.devices import session_defaults
from .dispatch import RayExecutor
from .interrupts import interrupt_board
from .replica import LorabindReplica

log = logging.getLogger("lorabind.server")

APP_NAME = "lorabind"
NAMESPACE = "lorabind"
# Replicas run the same offline rules as the front: no hub, no telemetry.
REPLICA_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_HUB_DISABLE_TELEMETRY": "1"}


def _replica_resources(replicas: int) -> dict:
    """One GPU per replica when the cluster has a GPU for each; otherwise a fair share of the CPUs."""
    import ray

    resources = ray.cluster_resources()
    if resources.get("GPU", 0) >= replicas:
        return {"num_gpus": 1}
    return {"num_cpus": min(1.0, resources.get("CPU", 1.0) / max(replicas, 1))}


def _group_options(replicas: int, world_size: int) -> tuple[dict, dict]:
    """(deployment options, one rank's bundle) for replicas of ``world_size`` ranks each: a placement group per
    replica with one bundle per rank, a GPU each when the cluster has one for every rank, else a fair share of
    the CPUs. The replica itself needs nothing (it coordinates), so it sits in bundle 0 beside rank 0."""
    import ray

    resources = ray.cluster_resources()
    ranks = replicas * world_size
    if resources.get("GPU", 0) >= ranks:
        bundle = {"GPU": 1.0}
    else:
        bundle = {"CPU": min(1.0, resources.get("CPU", 1.0) / ranks)}
    options = {"ray_actor_options": {"num_cpus": 0}, "placement_group_bundles": [dict(bundle)] * world_size,
               "placement_group_strategy": "PACK"}  # the ranks of a replica on one node when one can hold them
    return options, bundle


def start_replicas(address: str | None, replicas: int, node_classes: dict, *, models_root: str, input_dir: str,
                   output_dir: str, temp_dir: str, routing: str = "affinity", lora_dirs: tuple = (), parallel=None,
                   max_batch: int = 1):
    """Deploy ``replicas`` executors and return the front's ``RayExecutor``.

    ``address``: None starts a local cluster in this process; "auto" or "HOST:PORT" joins a running one
    (``ray start --head``). Every node needs lorabind installed and the same models root. ``parallel``: a
    ``ParallelSpec`` making each replica a group of ranks (``rank_group.py``); ``max_batch``: the prompts each
    replica runs at once, their steps batched.
    """
    import ray
    from ray import serve

    if replicas < 1:
        raise ValueError(f"--replicas must be at least 1, got {replicas}")
    env = {**REPLICA_ENV, **({"PYTHONPATH": os.environ["PYTHONPATH"]} if os.environ.get("PYTHONPATH") else {})}
    ray.init(address=address, namespace=NAMESPACE, ignore_reinit_error=True, include_dashboard=False,
             logging_level=logging.WARNING, runtime_env={"env_vars": env})
    serve.start(http_options={"location": "NoServer"})
    if parallel is not None and parallel.is_parallel:
        options, bundle = _group_options(replicas, parallel.world_size)
    else:
        options, bundle = {"ray_actor_options": _replica_resources(replicas)}, None
    log.info("deploying %d lorabind replica(s) with %s", replicas, options)
    app = LorabindReplica.options(num_replicas=replicas, **options).bind(
        node_classes, models_root, input_dir, NAMESPACE, session_defaults()["memory"], tuple(lora_dirs),
        parallel, bundle, max_batch)
    # Our own log lines say where each prompt went; Ray's per-call access log would repeat them per replica.
    handle = serve.run(app, name=APP_NAME, route_prefix=None,
                       logging_config={"enable_access_log": False, "log_level": "WARNING"})
    board = interrupt_board(NAMESPACE)
    return RayExecutor(handle, board, node_classes, {"output": output_dir, "temp": temp_dir},
                       replicas=replicas, routing=routing)


def stop_replicas() -> None:
    """Remove the deployment and disconnect (a cluster we started in-process goes down with it)."""
    import ray
    from ray import serve

    if ray.is_initialized():
        try:
            serve.delete(APP_NAME)
        finally:
            ray.shutdown()
