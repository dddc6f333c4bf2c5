"""The server's configuration: folders, network and upload limits, and where the pack's own files are."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from ..preview_options import PreviewOptions

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
    workflows_dir: str = str(PACK_DIR / "workflows" / "api")  # the API twins: what the templates name, rendered
    templates_dir: str = str(PACK_DIR / "workflows")  # the UI templates the editor lists (ComfyUI too)
    # Scale-out (``serve --ray``): None = run prompts here; "local" starts a Ray cluster in this process,
    # "auto" or "HOST:PORT" joins a running one.
    ray_address: Optional[str] = None
    replicas: int = 1
    routing: str = "affinity"  # or "round_robin" (for comparison: bench/scale_out.py)
    # ``serve --parallel``: a ParallelSpec; with --ray each replica is a group of ranks (scale_out/rank_group.py).
    parallel: Optional[object] = None
    # OpenAI-style endpoints (``serve --openai-model NAME=WORKFLOW.api.json``): (name, template path) pairs.
    openai_models: tuple = ()
    # ``--lora-backend distill --lora-path FILE...``: fused into every served template they fit, for the server's
    # lifetime (vllm-omni's distill backend); with the peft backend the files are preloaded adapters instead.
    distill_loras: tuple = ()
    # ``--allow-lora-dir``: folders besides <models>/loras that LoRA names and request adapter paths may come from.
    lora_dirs: tuple = ()
    # ``--max-batch N`` (vllm-omni's ``--max-num-seqs``): prompts in flight at once, their denoising steps batched
    # by the step engine (``loaders.batching``); 1 runs one prompt at a time, exactly as alone.
    max_batch: int = 1
    # Live previews of the samplers' steps (``--preview-method``, ``--preview-size``, ``--preview-interval``); a
    # prompt's ``preview_method`` (the frontend's setting) overrides the method, as in ComfyUI 0.30.
    previews: PreviewOptions = field(default_factory=lambda: PreviewOptions(method="auto"))

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
        self.lora_dirs = tuple(str(Path(d).expanduser().resolve()) for d in self.lora_dirs)
        return self

    def directory_for(self, kind: str) -> Optional[str]:
        """The folder behind ComfyUI's ``type`` field (output/input/temp), or None for anything else."""
        return {"output": self.output_dir, "input": self.input_dir, "temp": self.temp_dir}.get(kind)
