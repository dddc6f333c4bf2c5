"""The server's composition root: ``ServerState`` builds and wires the queue, history, WebSocket clients, worker
and executors from a ``ServerConfig``; every request handler reaches it as ``request.app[STATE_KEY]``."""

from __future__ import annotations

import concurrent.futures
import os
import threading

from aiohttp import web

from .. import folder_paths
from ..core_nodes import runtime_node_classes
from ..executor import PromptExecutor
from ..executor.engine_executors import EngineExecutors
from .config import PACK_NAME, ServerConfig
from .history import HistoryStore
from .queue import PromptQueue
from .websocket import ClientRegistry
from .worker import PromptWorker


class ServerState:
    """Everything a request handler needs, reachable as ``request.app[STATE_KEY]``."""

    def __init__(self, config: ServerConfig, *, node_classes: dict | None = None,
                 display_names: dict | None = None, executor=None, validator=None, unload_models=None):
        self.config = config.resolved()
        _configure_folder_paths(self.config)
        # /object_info's python_module for nodes without RELATIVE_PYTHON_MODULE: for the pack's own nodes,
        # what ComfyUI reports for a pack in custom_nodes/ (the frontend groups and badges nodes by it).
        self.python_module: str | None = None
        if node_classes is None:  # the pack's nodes and ComfyUI's core LoadImage/SaveImage/PreviewImage

            node_classes, display_names = runtime_node_classes()
            self.python_module = f"custom_nodes.{PACK_NAME}"
        self.node_classes = node_classes
        self.display_names = display_names or {}
        concurrency = 1
        self.scaled_out = executor is None and self.config.ray_address is not None
        if self.scaled_out:  # each prompt runs on a replica, not here; a few per replica are handed over at once
            # lazy: Ray is an optional extra; a single-machine server never imports it
            from ..scale_out.cluster import start_replicas
            from ..scale_out.dispatch import PROMPTS_IN_FLIGHT_PER_REPLICA  # lazy: as above

            executor = start_replicas(
                None if self.config.ray_address == "local" else self.config.ray_address, self.config.replicas,
                node_classes, models_root=self.config.models_root, input_dir=self.config.input_dir,
                output_dir=self.config.output_dir, temp_dir=self.config.temp_dir, routing=self.config.routing,
                lora_dirs=self.config.lora_dirs, parallel=self.config.parallel, max_batch=self.config.max_batch)
            concurrency = self.config.replicas * (PROMPTS_IN_FLIGHT_PER_REPLICA + self.config.max_batch - 1)
        if executor is None:  # prompts run here: up to max_batch at once, their steps batched by the engine
            executor = EngineExecutors(node_classes, self.config.max_batch)
            concurrency = self.config.max_batch
        else:  # a host's own executor (serve --parallel's rank 0): as many threads as it runs prompts at once
            concurrency = getattr(executor, "concurrency", concurrency)
        validator = validator or PromptExecutor(node_classes, cache=False)
        self.validator = validator
        # Validation runs off the event loop but serially: node VALIDATE_INPUTS may hash files.
        self.validation_pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="lorabind-validate")
        self.clients = ClientRegistry(self.status_payload, self.feature_flags)
        self.queue = PromptQueue(on_change=self.clients.broadcast_status)
        self.history = HistoryStore(os.path.join(self.config.state_dir, "history"))
        self.worker = PromptWorker(self.queue, self.history, self.clients, executor, concurrency=concurrency,
                                   unload_models=unload_models, previews=self.config.previews)
        self.clients.running_node = self.worker.running_node
        self.clients.has_prompts = self.queue.has_client
        # clear while ``lorabind serve`` builds the examples' models after listening (example_warm_up): a
        # prompt's validation, which builds what it names, waits for it rather than building the same files
        self.models_built = threading.Event()
        self.models_built.set()

    def status_payload(self) -> dict:
        return {"exec_info": {"queue_remaining": self.queue.remaining()}}

    def feature_flags(self) -> dict:
        # live previews go out as binary frames, with their node and prompt to a client that announces the same flag
        return {"supports_preview_metadata": True, "max_upload_size": self.config.max_upload_bytes}

    def routing_state(self) -> dict:
        """Where prompts went (``GET /lorabind/routing``); one machine has nothing to route."""
        routing = getattr(self.worker.executor, "routing_state", None)
        return routing() if routing is not None else {"mode": "local", "replicas": {}}

    def shutdown(self) -> None:
        self.worker.stop()
        if isinstance(self.worker.executor, EngineExecutors):
            self.worker.executor.close()
        self.validation_pool.shutdown(wait=False, cancel_futures=True)
        if self.scaled_out:
            from ..scale_out.cluster import stop_replicas  # lazy: only a scaled-out server has imported Ray

            stop_replicas()


def _configure_folder_paths(config: ServerConfig) -> None:
    folder_paths.configure(models_root=config.models_root, output_dir=config.output_dir,
                           input_dir=config.input_dir, temp_dir=config.temp_dir)
    for folder in config.lora_dirs:  # --allow-lora-dir
        folder_paths.add_model_folder_path("loras", folder)


STATE_KEY = web.AppKey("lorabind_state", ServerState)
