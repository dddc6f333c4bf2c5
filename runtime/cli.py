"""``lorabind`` command line: a thin dispatcher over ``runtime.commands``.

Why so thin: ``lorabind --help`` must answer in well under a second, so this module and every command
module import torch/diffusers only inside their ``run`` function.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

# name (= module under runtime.commands) -> one-line help
COMMANDS = {
    "run": "execute a workflow JSON (UI or API format) headless",
    "models": "build the built-in tiny models (build-tiny); check a workflow's model files (check); download a "
              "model's or a workflow's files (download)",
    "inspect": "describe a LoRA file or PEFT folder: format, rank, contract, key accounting",
    "merge": "fuse LoRA file(s) into a diffusers model folder or a single model file and write a new one",
    "extract": "extract a LoRA from the difference between a base and a tuned model",
    "serve": "serve the ComfyUI-compatible HTTP/WebSocket API",
    "plan": "what fits a GPU (or CPU) and which files to get, from a model's configs (no weights loaded)",
}
HUB_OFFLINE_SWITCHES = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
# whether the user's environment switched the hub off, as it was before `main` first set its own switch
_USERS_HUB_OFFLINE: list = []


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="lorabind",
        description="Exact, contract-enforcing LoRA binding for Wan2.1/2.2, Qwen-Image and MiniMax-H3 "
        "— headless runtime for ComfyUI workflows.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, help_text in COMMANDS.items():
        module = importlib.import_module(f".commands.{name}", __package__)
        cmd_parser = sub.add_parser(name, help=help_text, description=help_text)
        module.add_arguments(cmd_parser)
        cmd_parser.set_defaults(_command_module=module)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)  # what `run --parallel` hands to the ranks it starts
    if not getattr(args, "command", None):
        parser.print_help()
        return 2
    # Every command: never reach a model hub, whatever a library or the environment says. Set before the
    # command imports huggingface_hub, which reads it once at import. `models download` (and `run`/`serve
    # --download`) lifts it for itself only, unless the user had set it (hub_offline_by_user).
    if not _USERS_HUB_OFFLINE:
        _USERS_HUB_OFFLINE.append(any(os.environ.get(name, "").strip().upper() in ("1", "ON", "YES", "TRUE")
                                      for name in HUB_OFFLINE_SWITCHES))
    os.environ["HF_HUB_OFFLINE"] = "1"
    try:
        return int(args._command_module.run(args) or 0)
    except KeyboardInterrupt:
        print("lorabind: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return _reader_went_away()


def hub_offline_by_user() -> bool:
    """Whether the user's own environment set ``HF_HUB_OFFLINE`` / ``TRANSFORMERS_OFFLINE`` (not the runtime)."""
    return bool(_USERS_HUB_OFFLINE and _USERS_HUB_OFFLINE[0])


def _reader_went_away() -> int:
    """``lorabind plan --json | head``: the reader closed the pipe, which is its right, not our error. Point
    stdout at the null device so the interpreter's final flush cannot raise again, and exit as a shell's
    SIGPIPE'd command would (128 + 13) instead of printing a traceback."""
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, sys.stdout.fileno())
    os.close(null)
    return 141


if __name__ == "__main__":
    sys.exit(main())
