"""``lorabind models download``: which files, from where, and the run that gets them.

Which: exactly what ``lorabind plan`` names for a model (``--weights``, or the fastest choice that fits ``--vram``
/ ``--ram``, or a choice of ``plan --json``'s answer), or exactly the files ``lorabind models check`` lists for a
workflow. From where: the URL a workflow's loader node carries in ComfyUI's ``properties.models`` (name, url,
directory), else the published table (``loaders.placement.published``, the shipped ``files.json``). A file with
no known source is named, never guessed.

The run: the hub's metadata for every file first (size, sha256); files already present and matching it are
skipped; a present file that differs is left alone and named (it may be the user's own); the disk is checked for
the bytes still to get before the first byte; then each file is fetched, checked and put in place
(``hub_files``), with one progress bar per file and a total.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path

from ..loaders.io import json_limits
from ..loaders.placement.choices import Machine, files_of, rank_choices
from ..loaders.placement.published import known_sources, model_of, published_sources
from ..loaders.placement.storages import decode_size
from . import hub_files
from .hub_files import DownloadError
from .model_check import check_prompt_files
from .repository_models import is_repository_id

GB = 1e9


@dataclass(frozen=True)
class Wanted:
    destination: str  # "folder/name" under the models root
    url: str  # "" when no source is known


@dataclass
class DownloadPlan:
    to_get: list = field(default_factory=list)  # HubFiles with their metadata
    present: list = field(default_factory=list)  # HubFiles already there and verified
    unknown: list = field(default_factory=list)  # destinations with no known source

    @property
    def bytes_to_get(self) -> int:
        return sum(f.size for f in self.to_get)


def model_files(model: str, *, weights=None, memory="auto", vram=None, ram=None, device="cuda",
                plan_json=None) -> tuple:
    """``(configuration, ("folder/name", ...), how they were chosen)`` for a shipped configuration or its
    repository id; DownloadError naming what to give when the choice is not determined."""
    name = model_of(model) if model else None
    if plan_json is not None:
        return _plan_json_files(name, model, plan_json, weights, memory)
    if name is None:
        raise DownloadError(f"{model}: not a model lorabind knows the files of (give a shipped configuration such "
                            "as wan2.2-t2v-a14b, its repository id such as Wan-AI/Wan2.2-T2V-A14B-Diffusers, or a "
                            "workflow .json)")
    if vram is not None or (device == "cpu" and ram is not None):
        decode, source = decode_size(name, None, None)  # as plan answers: the model's own size, its headroom kept
        machine = Machine(device=device, vram_gib=vram, ram_gib=ram, decode=decode, decode_source=source)
        ranking = rank_choices(name, machine, weights=weights, memory=memory)
        if not ranking.fitting:
            raise DownloadError(f"{name}: {ranking.detail.plan.reason}")
        best = ranking.fitting[0]
        return name, best.files, f"plan's fastest choice that fits: --weights {best.weights} memory={best.plan.memory}"
    if weights is None:
        raise DownloadError(f"{name}: say which files: --weights W (bf16, fp8, q8_0, ... q4_0), --vram GIB [--ram "
                            "GIB] for plan's answer on your machine, or --plan-json FILE from `lorabind plan --json`")
    if memory != "auto":
        raise DownloadError("--memory narrows plan's choices for a machine: give --vram GIB (and --ram GIB) with it")
    files = files_of(name, weights)
    if not files:
        raise DownloadError(f"{name}: no published files for --weights {weights}")
    return name, files, f"--weights {weights}"


def _plan_json_files(name, model, path, weights, memory) -> tuple:
    """The first fitting choice of a saved ``plan --json`` answer (narrowed by ``--weights`` / ``--memory``)."""
    try:
        answer = json_limits.loads(Path(path).read_bytes())
    except (OSError, ValueError) as exc:
        raise DownloadError(f"--plan-json {path}: cannot read it: {exc}") from None
    if not isinstance(answer, dict) or not isinstance(answer.get("choices"), list):
        raise DownloadError(f"--plan-json {path}: not an answer of `lorabind plan MODEL ... --json`")
    planned = answer.get("model")
    name = name or (model_of(planned) if isinstance(planned, str) else None)
    if name is None or (model and isinstance(planned, str) and model_of(planned) != name):
        raise DownloadError(f"--plan-json {path}: plans {planned!r}, not {model!r}" if model else
                            f"--plan-json {path}: does not say its model; give MODEL too")
    for choice in answer["choices"]:
        if (isinstance(choice, dict) and choice.get("fits") and choice.get("files")
                and weights in (None, choice.get("weights")) and memory in ("auto", choice.get("memory"))):
            files = tuple(str(f) for f in choice["files"])
            return name, files, f"{path}: --weights {choice.get('weights')} memory={choice.get('memory')}"
    raise DownloadError(f"--plan-json {path}: no choice there fits" + (" with the --weights/--memory given"
                                                                       if weights or memory != "auto" else ""))


def wanted_for_model(name: str, files) -> list:
    sources = published_sources(name)
    return [Wanted(f, sources.get(f, "")) for f in files]


def wanted_for_workflow(prompt: dict, declared: dict, registry, weights=None) -> list:
    """Every file the workflow's API prompt names (``models check``'s list) with its source: the workflow's own
    ``properties.models`` URL (``declared``: {"folder/name": url}), else the published table. A loader's repository
    id stands for its published files (``weights``'s, else fp8 where published, else bf16). Built-in tiny models and
    names that are no file are left out."""
    table = known_sources()
    wanted = {}
    for check in check_prompt_files(prompt, registry):
        if check.kind == "diffusers":  # a repository id is its published single files
            destinations = _repository_files(check, weights) if is_repository_id(check.name) else ()
        else:
            destinations = () if check.what.startswith("built-in") else (f"{check.kind}/{check.name}",)
        for destination in destinations:
            wanted[destination] = Wanted(destination, declared.get(destination) or table.get(destination, ""))
    return list(wanted.values())


def _repository_files(check, weights) -> tuple:
    """A loader's repository id whose files are not all there: those of ``weights`` (else fp8 where published,
    else bf16)."""
    if check.found:
        return ()
    name = model_of(check.name)
    for storage in ([weights] if weights else ["fp8", "bf16"]):
        files = files_of(name, storage)
        if files:
            return files
    return ()


def declared_models(workflow: dict) -> dict:
    """{"directory/name": url} of a UI workflow's ``properties.models`` entries (ComfyUI's frontend shape:
    name, url, directory on each loader node, and the workflow's own ``models`` list)."""
    entries = list(workflow.get("models") or []) if isinstance(workflow, dict) else []
    for node in (workflow.get("nodes") or []) if isinstance(workflow, dict) else []:
        if isinstance(node, dict) and isinstance(node.get("properties"), dict):
            entries += node["properties"].get("models") or []
    return {f"{e['directory']}/{e['name']}": e["url"] for e in entries
            if isinstance(e, dict) and all(isinstance(e.get(k), str) for k in ("name", "url", "directory"))}


def prepare(wanted: list, models_root) -> DownloadPlan:
    """The hub's metadata for every wanted file with a source; files already present are checked against it.
    DownloadError for a gated/missing repository, or for a present file that is not the published one."""
    plan = DownloadPlan(unknown=[w.destination for w in wanted if not w.url])
    files = [hub_files.hub_file(w.destination, w.url) for w in wanted if w.url]
    for file in hub_files.with_metadata(files) if files else []:
        if not (Path(models_root) / file.destination).exists():
            plan.to_get.append(file)
            continue
        mismatch = hub_files.is_verified(models_root, file)
        if mismatch:
            raise DownloadError(f"models/{file.destination} is there but is not the published file ({mismatch}); "
                                "move it away and run again to download it")
        plan.present.append(file)
    return plan


def free_bytes(models_root) -> int:
    """Free bytes on the disk that holds (or will hold) the models root."""
    folder = Path(models_root).absolute()
    while not folder.exists():
        folder = folder.parent
    return shutil.disk_usage(folder).free


def check_space(plan: DownloadPlan, models_root) -> None:
    """Refuse before the first byte when the disk cannot take what is left to get (partial files count as got)."""
    needed = sum(f.size - hub_files.partial_bytes(models_root, f) for f in plan.to_get)
    free = free_bytes(models_root)
    if needed > free:
        raise DownloadError(f"not enough disk space under {models_root}: {len(plan.to_get)} file(s) need "
                            f"{needed / GB:.1f} GB, {free / GB:.1f} GB free; free some space or choose smaller files "
                            "(`lorabind plan MODEL --vram GIB` lists them)")


def describe(plan: DownloadPlan) -> list:
    """``--dry-run``'s lines: repository, file, size and destination of each file, what is present, what has no
    source."""
    lines = [f"get      {f.repo_id}  {f.path}  {f.size / GB:.2f} GB  -> models/{f.destination}" for f in plan.to_get]
    lines += [f"present  models/{f.destination} (verified)" for f in plan.present]
    lines += [f"unknown  models/{d}: no published source (put the file there yourself)" for d in plan.unknown]
    lines.append(f"{len(plan.to_get)} to get ({plan.bytes_to_get / GB:.2f} GB), {len(plan.present)} present"
                 + (f", {len(plan.unknown)} without a source" if plan.unknown else ""))
    return lines


def fetch_all(plan: DownloadPlan, models_root, say) -> list:
    """Fetch every file still to get; one bar per file (the hub's) and a total (ours), lines for logs."""
    from tqdm.auto import tqdm

    with tqdm(total=plan.bytes_to_get, unit="B", unit_scale=True, desc="total", position=0, disable=None) as total:
        if not total.disable:  # bars on a terminal: lines above them, not through them
            say = tqdm.write
        total.update(sum(hub_files.partial_bytes(models_root, f) for f in plan.to_get))
        done = []
        for number, file in enumerate(plan.to_get, 1):
            resumed = hub_files.partial_bytes(models_root, file)
            say(f"[{number}/{len(plan.to_get)}] {file.repo_id}/{file.path} ({file.size / GB:.2f} GB) -> "
                f"models/{file.destination}" + (f", resuming at {resumed} bytes" if resumed else ""))
            done.append(hub_files.fetch(models_root, file, total.update))
            say(f"verified models/{file.destination} ({'sha256 ' + file.sha256 if file.sha256 else 'git blob'})")
    return done


def download(wanted: list, models_root, *, dry_run: bool, say, offline_by_user: bool) -> DownloadPlan:
    """The whole command: metadata, skip, space, then fetch (or, with ``dry_run``, only say what would be)."""
    with hub_files.online(offline_by_user):
        plan = prepare(wanted, models_root)
        if dry_run:
            for line in describe(plan):
                say(line)
            return plan
        check_space(plan, models_root)
        fetch_all(plan, models_root, say)
    for destination in plan.unknown:
        say(f"unknown  models/{destination}: no published source (put the file there yourself)")
    say(f"{len(plan.to_get)} downloaded, {len(plan.present)} already present under {models_root}")
    return plan

