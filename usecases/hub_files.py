"""Files on a Hugging Face-compatible hub, brought into the ComfyUI model folders: ``lorabind models download``'s
transfer. Nothing else in lorabind reaches a hub (the runtime sets ``HF_HUB_OFFLINE=1`` for every command).

How, with huggingface_hub (imported only here, only when a download runs):

- the hub's metadata first: ``HfApi.get_paths_info`` gives each file's size and the sha256 of its LFS object (a
  file kept in git gives its git blob id instead), before the first byte is fetched; a gated or missing
  repository is refused there, in one line;
- the bytes through the hub's own ``file_download.http_get`` (its headers, token, redirects, retries and its
  per-file progress bar), into ``<models>/.lorabind-downloads/<folder>/<name>.part``, resumed from where a killed
  run stopped with a ``Range`` request;
- the whole file is checked against the published sha256 (or blob id) and only then renamed to
  ``<models>/<folder>/<name>``: a partial or corrupted file never has the final name.

Why not ``hf_hub_download``: it places a file at its repository path (``split_files/vae/…``), not in ComfyUI's
folders, and (huggingface_hub 2.x) downloads into a per-process temporary name that it deletes when interrupted,
so a killed 28 GB download started again from zero; it checks no hash on its ``local_dir`` path either.

The hub's cache is off: nothing is read from or written to ``~/.cache/huggingface`` (a 28 GB file is not stored
twice). ``HF_ENDPOINT``, ``HF_TOKEN`` (or the token ``hf auth login`` saved) and ``HF_HUB_OFFLINE`` work as in
every hub tool: the endpoint is read when the command runs, the token by the hub, and a user's own
``HF_HUB_OFFLINE=1`` refuses the download; only the runtime's own setting is lifted, for this command alone.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
from dataclasses import dataclass, replace
from pathlib import Path

from ..loaders.io.atomic_files import write_atomically
from ..loaders.io.file_identity import stat_identity

DEFAULT_ENDPOINT = "https://huggingface.co"
WORK_FOLDER = ".lorabind-downloads"  # under the models root: partial files and the record of verified files
VERIFIED_RECORD = "verified.json"
PARTIAL_SUFFIX = ".part"
HASH_CHUNK_BYTES = 8 << 20
# https://<host>/<owner>/<name>/resolve/<revision>/<path in the repository> (a /blob/ page URL names the same file)
_HUB_FILE_URL = re.compile(r"^https?://[^/]+/(?P<repo>[^/]+/[^/]+)/(?:resolve|blob)/(?P<revision>[^/]+)/(?P<path>.+)$")


class DownloadError(Exception):
    """One line for the user: the repository or file, and what to do."""


@dataclass(frozen=True)
class HubFile:
    destination: str  # "folder/name" under the models root (ComfyUI's layout)
    url: str  # as published (huggingface.co); the bytes come from HF_ENDPOINT when it is set
    repo_id: str
    revision: str
    path: str  # in the repository
    size: int = -1  # from the hub's metadata
    sha256: str = ""  # the LFS object's sha256
    blob_id: str = ""  # a file kept in git (no LFS): its git blob id

    @property
    def name(self) -> str:
        return self.destination.rsplit("/", 1)[-1]


def hub_file(destination: str, url: str) -> HubFile:
    """The hub file a published URL names; DownloadError naming the file for a URL of another shape."""
    match = _HUB_FILE_URL.match(url.split("?", 1)[0])
    if match is None:
        raise DownloadError(f"{destination}: {url} is not a Hugging Face file URL (…/OWNER/NAME/resolve/REVISION/PATH)")
    return HubFile(destination, url, match["repo"], match["revision"], match["path"])


def endpoint() -> str:
    """The hub the command talks to, read when it runs (the hub library reads ``HF_ENDPOINT`` once, at import)."""
    return (os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")


@contextlib.contextmanager
def online(offline_by_user: bool):
    """The hub reachable for the duration: huggingface_hub reads the offline switch once, at import, and the
    runtime has set it for every command; a user's own ``HF_HUB_OFFLINE`` / ``TRANSFORMERS_OFFLINE`` refuses."""
    if offline_by_user:
        raise DownloadError("HF_HUB_OFFLINE (or TRANSFORMERS_OFFLINE) is set in your environment: downloads are off; "
                            "unset it to download")
    from huggingface_hub import constants

    before = constants.HF_HUB_OFFLINE
    constants.HF_HUB_OFFLINE = False
    try:
        yield
    finally:
        constants.HF_HUB_OFFLINE = before


def with_metadata(files: list) -> list:
    """``files`` with each one's size and sha256 (or git blob id) from the hub, one request per repository;
    DownloadError, one line, for a gated, missing or unreachable repository or a file it does not hold."""
    from huggingface_hub import HfApi

    api = HfApi(endpoint=endpoint())
    found: dict = {}
    for repo_id, revision in dict.fromkeys((f.repo_id, f.revision) for f in files):
        paths = [f.path for f in files if (f.repo_id, f.revision) == (repo_id, revision)]
        try:
            entries = api.get_paths_info(repo_id, paths, revision=revision)
        except Exception as exc:  # noqa: BLE001 — the hub's and the HTTP library's errors, turned into one line
            raise DownloadError(one_line(exc, repo_id)) from None
        found.update({(repo_id, revision, e.path): e for e in entries if hasattr(e, "size")})
    described = []
    for file in files:
        entry = found.get((file.repo_id, file.revision, file.path))
        if entry is None:
            raise DownloadError(f"{file.repo_id}: no file {file.path} at revision {file.revision} (for "
                                f"models/{file.destination})")
        lfs = getattr(entry, "lfs", None)
        described.append(replace(file, size=int(entry.size), sha256=getattr(lfs, "sha256", "") or "",
                                 blob_id="" if lfs else getattr(entry, "blob_id", "") or ""))
    return described


def one_line(exc: Exception, repo_id: str) -> str:
    """What went wrong with a repository, in words a user can act on."""
    from huggingface_hub import errors

    if isinstance(exc, errors.GatedRepoError):
        return (f"{repo_id}: gated repository: accept its conditions at {DEFAULT_ENDPOINT}/{repo_id} and set HF_TOKEN "
                "(or run `hf auth login`) with a token of that account")
    if isinstance(exc, errors.RepositoryNotFoundError):
        return (f"{repo_id}: repository not found on {endpoint()} (a private one needs HF_TOKEN; check the name "
                "otherwise)")
    if isinstance(exc, errors.RevisionNotFoundError):
        return f"{repo_id}: revision not found on {endpoint()}"
    if isinstance(exc, errors.OfflineModeIsEnabled):
        return "HF_HUB_OFFLINE is set: downloads are off; unset it to download"
    status = getattr(getattr(exc, "response", None), "status_code", None)
    if status is not None:
        return f"{repo_id}: {endpoint()} answered HTTP {status}"
    return f"{repo_id}: cannot reach {endpoint()} ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})"


def partial_path(models_root, file: HubFile) -> Path:
    return Path(models_root) / WORK_FOLDER / (file.destination + PARTIAL_SUFFIX)


def partial_bytes(models_root, file: HubFile) -> int:
    """Bytes a killed run already fetched (they are kept and resumed), 0 when none or more than the file has."""
    try:
        have = partial_path(models_root, file).stat().st_size
    except OSError:
        return 0
    return have if have <= file.size else 0


def fetch(models_root, file: HubFile, on_bytes) -> Path:
    """Fetch one file (resuming its partial file), check it, and put it under its final name; ``on_bytes(n)``
    counts the bytes as they arrive. DownloadError when the bytes are not the published ones: the partial file is
    removed, nothing is written under the final name."""
    from huggingface_hub import hf_hub_url
    from huggingface_hub.file_download import http_get
    from huggingface_hub.utils import build_hf_headers

    partial = partial_path(models_root, file)
    partial.parent.mkdir(parents=True, exist_ok=True)
    have = partial_bytes(models_root, file)
    url = hf_hub_url(file.repo_id, file.path, revision=file.revision, endpoint=endpoint())
    with open(partial, "r+b" if have else "wb") as out:
        out.truncate(have)
        out.seek(have)
        try:
            http_get(url, _Counting(out, on_bytes), resume_size=have, expected_size=file.size,
                     headers=build_hf_headers(library_name="lorabind"), displayed_filename=file.name)
        except Exception as exc:  # noqa: BLE001 — the hub's and the HTTP library's errors, turned into one line
            raise DownloadError(f"{file.destination}: {one_line(exc, file.repo_id)} (the {partial.stat().st_size} "
                                "bytes fetched are kept; run the command again to resume)") from None
    mismatch = differs(partial, file)
    if mismatch:
        partial.unlink()
        raise DownloadError(f"{file.destination}: {mismatch}; the download was removed, nothing was written under "
                            f"models/{file.destination}")
    final = Path(models_root) / file.destination
    final.parent.mkdir(parents=True, exist_ok=True)
    os.replace(partial, final)
    remember_verified(models_root, file)
    return final


def differs(path: Path, file: HubFile) -> str:
    """Why the file at ``path`` is not the published one ("" when it is): its size, then its sha256 (or git blob
    id), hashed in chunks."""
    size = path.stat().st_size
    if size != file.size:
        return f"{size} bytes, the published file has {file.size}"
    if file.sha256:
        digest = hashlib.sha256()
        expected, kind = file.sha256, "sha256"
    elif file.blob_id:
        digest = hashlib.sha1(b"blob %d\0" % size)  # git's blob id: the hub lists a non-LFS file by it
        expected, kind = file.blob_id, "git blob id"
    else:
        return ""
    with open(path, "rb") as handle:
        while chunk := handle.read(HASH_CHUNK_BYTES):
            digest.update(chunk)
    got = digest.hexdigest()
    return "" if got == expected else f"{kind} {got} is not the published {expected}"


def is_verified(models_root, file: HubFile) -> str:
    """"" when ``models/<destination>`` is the published file, else why not. A file this command checked and has
    not changed since (same identity) is not hashed again; one put there by hand is hashed once, then remembered."""
    path = Path(models_root) / file.destination
    record = _read_record(models_root).get(file.destination)
    if record == [list(stat_identity(path.stat())), file.sha256 or file.blob_id]:
        return ""
    mismatch = differs(path, file)
    if not mismatch:
        remember_verified(models_root, file)
    return mismatch


def remember_verified(models_root, file: HubFile) -> None:
    record = _read_record(models_root)
    record[file.destination] = [list(stat_identity((Path(models_root) / file.destination).stat())),
                                file.sha256 or file.blob_id]
    path = Path(models_root) / WORK_FOLDER / VERIFIED_RECORD
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(record, indent=1, sort_keys=True)
    write_atomically(str(path), lambda temp: Path(temp).write_text(text, encoding="utf-8"))


def _read_record(models_root) -> dict:
    try:
        record = json.loads((Path(models_root) / WORK_FOLDER / VERIFIED_RECORD).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return record if isinstance(record, dict) else {}


class _Counting:
    """The partial file as ``http_get`` writes it, counting the bytes for the total progress bar."""

    def __init__(self, handle, on_bytes):
        self._handle, self._on_bytes = handle, on_bytes

    def write(self, data) -> int:
        written = self._handle.write(data)
        self._on_bytes(len(data))
        return written

    def __getattr__(self, name):  # seek / tell / truncate: a server that ignores Range makes http_get start over
        return getattr(self._handle, name)
