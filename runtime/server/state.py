"""Server configuration and the state shared by every route: queue, history, clients, worker, executors."""

from __future__ import annotations

import concurrent.futures
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from aiohttp import web

from .history import HistoryStore
from .queue import PromptQueue
from .websocket import ClientRegistry
from .worker import PromptWorker

PACK_DIR = Path(__file__).resolve().parents[2]
PACK_NAME = "lorabind"  # the folder name ComfyUI would use in /extensions/<name>/ and /workflow_templates
DEFAULT_MAX_UPLOAD_MB = 100.0  # ComfyUI's default


@dataclass
class ServerConfig:
    listen: str = "127.0.0.1"
    port: int = 8188
    models_root: str = "models"
    output_dir: str = "output"
    input_dir: str = "input"
    temp_dir: str = "temp"
    # Server state (history). None: ``.lorabind-state`` beside the output folder. It must not lie inside the
    # output/input/temp folders, which uploads and /view reach (a forged history entry, or a file that stops
    # the next start, must not be one upload away).
    state_dir: Optional[str] = None
    # Host names (besides loopback ones) a loopback-bound server answers to; see app.host_check_middleware.
    allowed_hosts: tuple = ()
    cors_origin: Optional[str] = None  # None: origin check on; "*" or an origin: CORS headers instead
    max_upload_mb: float = DEFAULT_MAX_UPLOAD_MB
    # Frontend extension folders served at /extensions/<name>/ and listed by GET /extensions.
    web_extensions: dict[str, str] = field(default_factory=lambda: {PACK_NAME: str(PACK_DIR / "web")})
    workflows_dir: str = str(PACK_DIR / "workflows")

    @property
    def max_upload_bytes(self) -> int:
        return round(self.max_upload_mb * 1024 * 1024)

    def resolved(self) -> "ServerConfig":
        """Absolute, created folders (the confinement checks compare absolute real paths)."""
        for name in ("models_root", "output_dir", "input_dir", "temp_dir"):
            path = Path(getattr(self, name)).expanduser().resolve()
            path.mkdir(parents=True, exist_ok=True)
            setattr(self, name, str(path))
        state = Path(self.state_dir or Path(self.output_dir).parent / ".lorabind-state").expanduser().resolve()
        for name in ("output_dir", "input_dir", "temp_dir"):
            reachable = Path(getattr(self, name))
            if state == reachable or reachable in state.parents:
                raise ValueError(f"the state folder {state} lies inside the {name.split('_')[0]} folder {reachable}, "
                                 f"where uploads could reach it; choose another with --state-dir")
        state.mkdir(parents=True, exist_ok=True)
        self.state_dir = str(state)
        return self

    def directory_for(self, kind: str) -> Optional[str]:
        """The folder behind ComfyUI's ``type`` field (output/input/temp), or None for anything else."""
        return {"output": self.output_dir, "input": self.input_dir, "temp": self.temp_dir}.get(kind)


class ServerState:
    """Everything a request handler needs, reachable as ``request.app[STATE_KEY]``."""

    def __init__(self, config: ServerConfig, *, node_classes: dict | None = None,
                 display_names: dict | None = None, executor=None, validator=None):
        self.config = config.resolved()
        _configure_folder_paths(self.config)
        # /object_info's python_module for nodes without RELATIVE_PYTHON_MODULE: for the pack's own nodes,
        # what ComfyUI reports for a pack in custom_nodes/ (the frontend groups and badges nodes by it).
        self.python_module: str | None = None
        if node_classes is None:
            from ...nodes import NODE_CLASS_MAPPINGS, NODE_DISPLAY_NAME_MAPPINGS

            node_classes, display_names = NODE_CLASS_MAPPINGS, NODE_DISPLAY_NAME_MAPPINGS
            self.python_module = f"custom_nodes.{PACK_NAME}"
        self.node_classes = node_classes
        self.display_names = display_names or {}
        if executor is None or validator is None:
            from ..executor import PromptExecutor

            executor = executor or PromptExecutor(node_classes)
            validator = validator or PromptExecutor(node_classes, cache=False)
        self.validator = validator
        # Validation runs off the event loop but serially: node VALIDATE_INPUTS may hash files.
        self.validation_pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="lorabind-validate")
        self.clients = ClientRegistry(self.status_payload, self.feature_flags)
        self.queue = PromptQueue(on_change=self.clients.broadcast_status)
        self.history = HistoryStore(os.path.join(self.config.state_dir, "history"))
        self.worker = PromptWorker(self.queue, self.history, self.clients, executor)
        self.clients.running_node = self.worker.running_node

    def status_payload(self) -> dict:
        return {"exec_info": {"queue_remaining": self.queue.remaining()}}

    def feature_flags(self) -> dict:
        # We never send binary preview frames, so we do not claim preview-metadata support.
        return {"supports_preview_metadata": False, "max_upload_size": self.config.max_upload_bytes}

    def shutdown(self) -> None:
        self.worker.stop()
        self.validation_pool.shutdown(wait=False, cancel_futures=True)


def _configure_folder_paths(config: ServerConfig) -> None:
    from .. import folder_paths

    folder_paths.configure(models_root=config.models_root, output_dir=config.output_dir,
                           input_dir=config.input_dir, temp_dir=config.temp_dir)


STATE_KEY = web.AppKey("lorabind_state", ServerState)
