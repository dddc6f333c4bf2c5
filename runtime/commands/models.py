"""``lorabind models build-tiny``: build the built-in offline tiny models and fixture LoRAs that are missing or
stale (``--force``: all of them).
``lorabind models check WORKFLOW``: every model file the workflow names, found, broken or missing, with the folders
searched (exit 1 when one is missing or broken).
``lorabind models download MODEL|WORKFLOW.json``: get those files (``model_download``).

Module-level imports stay light (the CLI's ``--help`` must not load torch); the builders load inside ``run``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

DEFAULT_MODELS_ROOT = "./models"
DEFAULT_INPUT_DIR = "./input"  # the default of `lorabind run --input` and `lorabind serve --input`


def add_arguments(parser) -> None:
    # lazy: the CLI's parser imports every command module; the download action's flags live with it
    from . import model_download

    sub = parser.add_subparsers(dest="models_command", metavar="ACTION")
    build = sub.add_parser(
        "build-tiny",
        help="build the built-in tiny models (random weights, offline, deterministic) under MODELS/diffusers",
        description="Build the built-in tiny models (random weights, offline, deterministic). Without --only, "
        "also the MiniMax-H3 tiny models, the synthetic fixture LoRAs and the example input images "
        "(INPUT/lorabind-tiny/start.png, end.png).",
    )
    build.add_argument("--models", metavar="DIR", default=None,
                       help=f"models root (default: $LORABIND_MODELS or {DEFAULT_MODELS_ROOT})")
    build.add_argument("--input", metavar="DIR", default=DEFAULT_INPUT_DIR,
                       help=f"input folder for the example images (default {DEFAULT_INPUT_DIR})")
    build.add_argument("--only", metavar="NAME", nargs="+", default=None,
                       help="build only these models (e.g. tiny-wan22-t2v)")
    build.add_argument("--force", action="store_true",
                       help="rebuild what is current too (by default a model built by the installed library "
                            "versions, and the files made from it, are kept)")
    build.add_argument("--comfyui", action="store_true",
                       help="also the files ComfyUI's own loaders accept (the ComfyUI-native examples): two Wan2.2 "
                       "experts ComfyUI detects and their lightx2v LoRA pair, a one-block Qwen-Image at the real width "
                       "(ComfyUI fixes it; about 760 MB) and its Lightning LoRA, ComfyUI's full-size Wan2.1 VAE "
                       "(Qwen-Image's too) with random weights (about 250 MB) and, with diffusers 0.42, a MiniMax-H3 "
                       "denoiser ComfyUI 0.30 detects")
    check = sub.add_parser(
        "check", help="list every model file a workflow names: found (and what it is), broken (empty, truncated or "
                      "another kind of file, read from its header) or missing (and where it was looked for)")
    check.add_argument("workflow", metavar="WORKFLOW.json", help="workflow (UI or API format)")
    check.add_argument("--models", metavar="DIR", default=None,
                       help=f"models root (default: $LORABIND_MODELS or {DEFAULT_MODELS_ROOT})")
    model_download.add_parser(sub)


def run(args) -> int:
    command = getattr(args, "models_command", None)
    if command == "check":
        return check(args)
    if command == "download":
        # lazy: the CLI's parser imports every command module; the engine loads when it runs
        from . import model_download

        return model_download.run(args)
    if command != "build-tiny":
        print("usage: lorabind models build-tiny [--models DIR] [--only NAME ...] | models check WORKFLOW.json | "
              "models download MODEL|WORKFLOW.json", file=sys.stderr)
        return 2
    models_root = Path(args.models or os.environ.get("LORABIND_MODELS") or DEFAULT_MODELS_ROOT)
    # lazy: the CLI's parser imports every command module; the engine loads when it runs
    from ...loaders.errors import LoraBindError
    from ...tiny_models import BUILTIN_NAMES, build_tiny, unavailable_builtins

    if args.only:
        unknown = sorted(set(args.only) - set(BUILTIN_NAMES))
        if unknown:
            print(f"lorabind models build-tiny: unknown model(s) {', '.join(unknown)}; "
                  f"known: {', '.join(BUILTIN_NAMES)}", file=sys.stderr)
            return 2
    try:
        written = build_tiny(models_root, args.only, input_dir=None if args.only else args.input,
                             force=args.force)
    except LoraBindError as exc:  # a library too old, or a folder in the way that no build wrote
        print(f"lorabind models build-tiny: {exc}", file=sys.stderr)
        return 1
    if args.comfyui:
        # lazy: the CLI's parser imports every command module; the engine loads when it runs
        from ...tiny_models.comfyui_files import write_comfyui_files

        written += write_comfyui_files(models_root)
    if not args.only:
        for name, why in unavailable_builtins().items():
            print(f"skipped {name}: {why}")
    for path in written:
        print(f"wrote {path}")
    kept = "" if args.force else "; what was current is kept (--force rebuilds it)"
    print(f"{len(written)} item(s) written under {models_root.resolve()}{kept}")
    return 0


def check(args) -> int:
    """Print one line per file the workflow names; 1 when any is missing or broken (empty, truncated, another kind
    of file: its header says so), 2 for a workflow that cannot be read."""
    # lazy: the CLI's parser imports every command module; the engine loads when it runs
    from ...usecases.model_check import check_prompt_files
    from .. import folder_paths
    from ..workflow_format import WorkflowFormatError, to_api_prompt
    from .run import RunError, _load_json, load_node_classes

    folder_paths.configure(models_root=args.models)
    try:
        node_classes, display_names = load_node_classes()
        prompt, _ = to_api_prompt(_load_json(args.workflow), node_classes, display_names)
    except (RunError, WorkflowFormatError) as exc:
        print(f"lorabind models check: {args.workflow}: {exc}", file=sys.stderr)
        return 2
    checks = check_prompt_files(prompt, folder_paths)
    for item in checks:
        print(item.line())
    missing = [c for c in checks if not c.found]
    broken = [c for c in checks if c.broken]
    print(f"{len(checks) - len(missing) - len(broken)} found, {len(missing)} missing"
          f"{f', {len(broken)} broken' if broken else ''} under {Path(folder_paths.models_dir).resolve()}")
    return 1 if missing or broken else 0
