"""Contract lookups for the editor route, run in a small worker pool with a timeout and cached by file identity.

Why: the web extension asks ``/lorabind/contract`` by itself for every LoRA a workflow names, so a lookup must
never cost the server much, however often it comes and whatever the file holds. Each answer, refusals included,
is cached under the identity of the files it was read from (device, inode, size, mtime of the file, or of a
folder's entries, and the version of each contract table beside it): asking again costs a few ``stat`` calls until a file changes. Concurrent lookups of one file
share one read; at most ``WORKERS`` files are read at once; a lookup that takes longer than ``TIMEOUT_S`` answers
503, and its read stops at the same deadline (``read_deadline``: the loops that can run long however bounded the
input, such as hashing a file for a contract table's ``sha256:`` entries, check it) without caching anything. The cache holds ``MAX_ENTRIES`` small JSON
answers, oldest dropped first.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
from collections import OrderedDict
from typing import Callable

from ..usecases.verbs import contract_table_versions, file_identity, read_deadline
from ..usecases.vocabulary import DeadlinePassed, LoraBindError

WORKERS = 2
TIMEOUT_S = 30.0
MAX_ENTRIES = 512
MAX_REASON_CHARS = 2000

Answer = tuple  # (HTTP status, JSON body)


def refusal(name: str, reason: str, status: int) -> Answer:
    """The endpoint's answer when no contract can be given: the report's shape with the reason."""
    return status, {"file": name, "family": None, "contract": None, "contracts": [], "reason": reason}


def _declared(name: str, path: str, declaration: Callable[[str, str], dict], seconds: float) -> Answer:
    try:
        with read_deadline(seconds, f"reading {name!r}"):
            return 200, declaration(path, name)
    except DeadlinePassed:  # the asker has had its 503; the work stopped and nothing is cached
        return None
    except LoraBindError as exc:  # a refused file (pickle, broken header, a contract it declares wrongly)
        return refusal(name, str(exc).replace(path, name)[:MAX_REASON_CHARS], 422)
    except OSError as exc:
        return refusal(name, f"{name!r} cannot be read ({exc.strerror})", 422)


def _versions(path: str) -> tuple:
    """What a cached answer depends on: the file's identity (its ctime included: a rewrite that restores the size
    and mtime moves it, and a table's ``sha256:`` entry must then be matched again) and the version of each
    contract table that may apply to it (a table added or edited later changes the answer, as it does for
    ``/prompt``)."""
    return file_identity(path), contract_table_versions(path)


class ContractLookups:
    """The cache and pool behind ``get_declared_contract`` (one per process: ``LOOKUPS``)."""

    def __init__(self):
        self._answers: OrderedDict[tuple, Answer] = OrderedDict()
        self._running: dict[tuple, concurrent.futures.Future] = {}
        self._lock = threading.Lock()
        self._pool = concurrent.futures.ThreadPoolExecutor(WORKERS, thread_name_prefix="lorabind-contract")
        self.reads = 0  # lookups that read files (the rest were answered from the cache or joined a read)

    async def answer(self, kind: str, name: str, path: str, declaration: Callable[[str, str], dict]) -> Answer:
        """The cached answer for these files, or one read in the pool (shared with concurrent askers)."""
        try:
            key = (kind, name, path, await asyncio.to_thread(_versions, path))
        except OSError as exc:
            return refusal(name, f"{name!r} cannot be read ({exc.strerror})", 404)
        with self._lock:
            if key in self._answers:
                self._answers.move_to_end(key)
                return self._answers[key]
            future = self._running.get(key)
            if future is None:
                deadline = time.monotonic() + TIMEOUT_S  # the asker's: a read waiting for a worker has less
                future = self._pool.submit(self._read, key, name, path, declaration, deadline)
                self._running[key] = future
                self.reads += 1
        try:
            answer = await asyncio.wait_for(asyncio.shield(asyncio.wrap_future(future)), TIMEOUT_S)
        except asyncio.TimeoutError:
            answer = None
        return answer or refusal(name, f"reading {name!r} takes longer than {TIMEOUT_S:g} s; ask again later", 503)

    def _read(self, key: tuple, name: str, path: str, declaration, deadline: float) -> Answer:
        answer = None
        try:
            answer = _declared(name, path, declaration, max(deadline - time.monotonic(), 0.0))
        finally:  # stored and released in one step; an unexpected error is not cached (the next ask reads again)
            with self._lock:
                self._running.pop(key, None)
                if answer is not None:
                    self._answers[key] = answer
                    while len(self._answers) > MAX_ENTRIES:
                        self._answers.popitem(last=False)
        return answer


LOOKUPS = ContractLookups()
