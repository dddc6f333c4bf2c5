"""What ``run`` and ``serve`` do about a workflow's model files that are not there: name the one
``lorabind models download`` command that gets them, or, with ``--download``, run that command's code first.

Why here and not in the executor: nothing downloads unless the user asks, and the asking is a flag of the command
line; the executor only ever sees files that are there. The files and their sources are ``models check``'s and
``models download``'s (``usecases.model_downloads``), so the command named is exactly the one that fetches them.
"""

from __future__ import annotations

import shlex
from pathlib import Path

from ..usecases.model_check import check_prompt_files
from ..usecases.model_downloads import DownloadError, declared_models, download, wanted_for_workflow
from . import folder_paths
from .cli import hub_offline_by_user


def missing_files(prompt: dict) -> list:
    """The ``FileCheck``s of the prompt's files that are missing or broken (built-in tiny models are never)."""
    return [c for c in check_prompt_files(prompt, folder_paths) if not c.found or c.broken]


def download_command(workflow_path, models_root) -> str:
    """``lorabind models download WORKFLOW --models DIR``, the workflow named as the user can type it (relative
    to the current folder when it is below it)."""
    path = Path(workflow_path)
    try:
        shown = str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        shown = str(path)
    return f"lorabind models download {shlex.quote(shown)} --models {shlex.quote(str(models_root))}"


def fetch_or_name(prompt: dict, workflow, workflow_path, models_root, *, fetch: bool, say) -> str:
    """"" when every file the prompt names is there (after fetching the missing ones with ``fetch``); else one
    line saying how many are missing and the command that gets them (DownloadError's line when a fetch failed)."""
    missing = missing_files(prompt)
    if not missing:
        return ""
    wanted = wanted_for_workflow(prompt, declared_models(workflow), folder_paths)
    if not fetch:
        names = ", ".join(sorted({c.name for c in missing}))
        if not any(w.url for w in wanted):
            return f"{len(missing)} model file(s) missing under {models_root} ({names}), none with a published source"
        return (f"{len(missing)} model file(s) missing under {models_root} ({names}); get them with: "
                f"{download_command(workflow_path, models_root)} (or add --download)")
    absent = [w for w in wanted if _absent(w.destination)]  # files placed by hand are not hashed here
    try:
        download(absent, models_root, dry_run=False, say=say, offline_by_user=hub_offline_by_user())
    except DownloadError as exc:
        return str(exc)
    still = missing_files(prompt)
    return "" if not still else (f"{len(still)} model file(s) still missing under {models_root} after --download "
                                 f"(no published source: {', '.join(sorted(c.name for c in still))})")


def _absent(destination: str) -> bool:
    kind, name = destination.split("/", 1)
    try:
        return folder_paths.get_full_path(kind, name) is None
    except (KeyError, ValueError):
        return True
