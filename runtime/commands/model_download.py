"""``lorabind models download MODEL|WORKFLOW.json``: get the files ``plan`` or ``models check`` names from the
repositories they are published in, into the ComfyUI folders under ``--models`` (``usecases.model_downloads``).

MODEL is a shipped configuration (wan2.2-t2v-a14b ...) or its repository id (Wan-AI/Wan2.2-T2V-A14B-Diffusers);
which of its files is ``plan``'s choice: ``--weights``, or the fastest that fits ``--vram``/``--ram``, or a saved
``plan --json`` answer (``--plan-json``). A workflow gets every file ``models check`` lists for it. Exit 0 when
everything is there afterwards, 1 when something could not be got (gated, missing, disk full, not the published
bytes), 2 for bad input. Module-level imports stay light (the CLI's ``--help`` must not load torch).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

DEFAULT_MODELS_ROOT = "./models"  # as `models check`
WEIGHTS = ("bf16", "fp8", "q8_0", "q6_k", "q5_k", "q5_0", "q4_k", "q4_0")  # loaders.placement.sizes.WEIGHTS
MEMORY_CHOICES = ("auto", "full", "swap_experts", "offload_model", "offload_blocks")  # as `plan --memory`


def add_parser(sub) -> None:
    """The ``download`` action of ``lorabind models``."""
    # lazy: the CLI's parser imports every command module; plan's amount parser lives with plan
    from .plan import gib_amount

    download = sub.add_parser(
        "download", help="download the files plan (MODEL) or models check (WORKFLOW.json) names from their published "
                         "repositories into the ComfyUI folders under --models",
        description="Download exactly the files `lorabind plan` names for MODEL (or `lorabind models check` for a "
                    "workflow) through huggingface_hub: HF_ENDPOINT, HF_TOKEN and HF_HUB_OFFLINE work as in every "
                    "hub tool; the hub's cache is not used. Resumes an interrupted download, checks each file's "
                    "sha256 before it gets its final name, skips files already there.")
    download.add_argument("target", metavar="MODEL|WORKFLOW.json", nargs="?",
                          help="a shipped configuration (wan2.2-t2v-a14b, qwen-image, ...), its repository id "
                               "(Wan-AI/Wan2.2-T2V-A14B-Diffusers), or a workflow (UI or API format); may be left "
                               "out with --plan-json, whose answer names its model")
    download.add_argument("--models", metavar="DIR", default=None,
                          help=f"models root (default: $LORABIND_MODELS or {DEFAULT_MODELS_ROOT})")
    download.add_argument("--weights", choices=WEIGHTS, default=None,
                          help="MODEL's files in this storage (as `plan --weights`); for a workflow, the storage of "
                               "a loader's repository id (default fp8 where published)")
    download.add_argument("--memory", choices=MEMORY_CHOICES, default="auto",
                          help="with --vram: only choices of this memory plan (as `plan --memory`)")
    download.add_argument("--vram", type=gib_amount, metavar="GIB",
                          help="free device memory: the files of plan's fastest choice that fits")
    download.add_argument("--ram", type=gib_amount, metavar="GIB", help="free host memory (as `plan --ram`)")
    download.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                          help="cpu: plan for a machine without a GPU, with --ram (as `plan --device`)")
    download.add_argument("--plan-json", metavar="FILE", default=None,
                          help="the files of the first fitting choice of a saved `lorabind plan MODEL ... --json` "
                               "answer (narrowed by --weights / --memory)")
    download.add_argument("--dry-run", action="store_true",
                          help="list repository, file, size and destination of each file; download nothing")


def models_root_of(args) -> Path:
    return Path(args.models or os.environ.get("LORABIND_MODELS") or DEFAULT_MODELS_ROOT)


def run(args) -> int:
    # lazy: the CLI's parser imports every command module; the downloader imports the hub and the planner
    from ...usecases.model_downloads import DownloadError, download
    from ..cli import hub_offline_by_user

    if args.target is None and args.plan_json is None:
        print("lorabind models download: give MODEL or WORKFLOW.json (or --plan-json FILE)", file=sys.stderr)
        return 2
    root = models_root_of(args)
    try:
        wanted = wanted_files(args)
        if wanted is None:
            return 2
        download(wanted, root, dry_run=args.dry_run, say=print, offline_by_user=hub_offline_by_user())
    except DownloadError as exc:
        print(f"lorabind models download: {exc}", file=sys.stderr)
        return 1
    return 0


def wanted_files(args):
    """The files to get with their sources (``Wanted``), or None after printing why the input is bad."""
    # lazy: the CLI's parser imports every command module; the engine loads when it runs
    from ...loaders.errors import LoraBindError
    from ...usecases.model_downloads import DownloadError, model_files, wanted_for_model

    if args.target and is_workflow(args.target):
        return _workflow_wanted(args)
    try:
        name, files, how = model_files(args.target, weights=args.weights, memory=args.memory, vram=args.vram,
                                       ram=args.ram, device=args.device, plan_json=args.plan_json)
    except LoraBindError as exc:
        raise DownloadError(str(exc)) from None
    print(f"{name}: {len(files)} file(s), {how}")
    return wanted_for_model(name, files)


def is_workflow(target: str) -> bool:
    return target.endswith(".json") or os.path.isfile(target)


def _workflow_wanted(args):
    """``models check``'s files of a workflow, with the URLs its loader nodes declare."""
    # lazy: the CLI's parser imports every command module; the engine loads when it runs
    from ...usecases.model_downloads import declared_models, wanted_for_workflow
    from .. import folder_paths
    from ..workflow_format import WorkflowFormatError, to_api_prompt
    from .run import RunError, _load_json, load_node_classes

    folder_paths.configure(models_root=str(models_root_of(args)))
    try:
        workflow = _load_json(args.target)
        node_classes, display_names = load_node_classes()
        prompt, _ = to_api_prompt(workflow, node_classes, display_names)
    except (RunError, WorkflowFormatError) as exc:
        print(f"lorabind models download: {args.target}: {exc}", file=sys.stderr)
        return None
    wanted = wanted_for_workflow(prompt, declared_models(workflow), folder_paths, weights=args.weights)
    print(f"{args.target}: {len(wanted)} model file(s)")
    return wanted
