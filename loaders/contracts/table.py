"""The user contract table: ``lorabind-contracts.json`` beside the LoRAs gives a contract to files whose names
say nothing (a user's own distill LoRA, a published file saved under another name).

Why a table and not a rename: people keep the names files were downloaded or trained under, and a hash keeps
working whatever the name becomes. Precedence, applied by the families (``distill_names.declared``): the file's
own safetensors metadata wins over the table, and the table wins over what the name grammar reads.

The table is one JSON object; each key is a glob over the file name (``my_speedup_*.safetensors``, or with its
folder: ``Release-4steps/*.safetensors``) or ``sha256:<64 hex digits>`` of the file's content; each value is a
contract in the metadata's ``sampling_contract`` words (``"steps=4, shift=5, cfg=1"``, or ``"none"``). The
first matching key in file order wins. It is looked for in the LoRA's folder, then the folder above (a release
folder such as ``…-Seko-V1.1/high_noise_model.safetensors`` sits one level below the loras root), nearest
first. Every error names the table and the line.
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
from dataclasses import dataclass
from typing import Callable, Optional

from ..errors import ContractError
from ..io.file_identity import LatestVersionCache, stat_identity
from ..io.read_deadline import check_deadline
from ..io.regular_files import open_regular
from .baked import file_sha256

TABLE_NAME = "lorabind-contracts.json"
MAX_TABLE_BYTES = 1 << 20  # a list of names, not a data set: a larger file is refused, not read
MAX_TABLE_ENTRIES = 10_000  # each lookup may try every entry: a longer table is refused by its line
_SHA256 = re.compile(r"^sha256:([0-9a-f]{64})$")
MAX_CACHED_PATHS = 1024  # tables and hashed LoRA files remembered at their latest version
_cache = LatestVersionCache(MAX_CACHED_PATHS)  # table path -> [TableLine]
_hash_cache = LatestVersionCache(MAX_CACHED_PATHS)  # real path of a LoRA file -> sha256


@dataclass(frozen=True)
class TableEntry:
    """One matching table line: the contract text and where it was written (``lorabind-contracts.json line
    3``: no local path, so it can be shown in the browser)."""

    contract: str
    where: str


@dataclass(frozen=True)
class TableLine:
    """A parsed entry with its pattern compiled once per table version (``fnmatch`` recompiles past its small
    cache, which a long table overran on every lookup)."""

    key: str
    contract: str
    line: int
    sha256: Optional[str]  # the hex digest of a ``sha256:`` key, else None
    matches_name: Optional[Callable]  # the compiled glob of a name pattern, else None


def _table_paths(path: str) -> tuple:
    """Where the tables for the LoRA at ``path`` may be, nearest first, with the folder each applies from."""
    folder = os.path.dirname(os.path.abspath(str(path).rstrip("/\\")))
    return tuple((table_folder, os.path.join(table_folder, TABLE_NAME))
                 for table_folder in (folder, os.path.dirname(folder)))


def table_versions(path: str) -> tuple:
    """The version of each table that may apply to the LoRA at ``path`` (None where there is none): a cached
    answer about the file is stale when this changes."""
    versions = []
    for _, table in _table_paths(path):
        try:
            versions.append(stat_identity(os.stat(table)))
        except OSError:
            versions.append(None)
    return tuple(versions)


def table_entry(path: str) -> Optional[TableEntry]:
    """The entry of the nearest contract table that matches the LoRA at ``path``, or None."""
    for table_folder, table in _table_paths(path):
        if not os.path.isfile(table):
            continue
        names = _names_for_matching(path, table_folder)
        digest = None
        for entry in _entries(table):
            check_deadline()
            if entry.sha256 is not None:
                digest = digest or _sha256(path)
                matched = entry.sha256 == digest
            else:
                matched = any(entry.matches_name(name) for name in names)
            if matched:
                return TableEntry(contract=entry.contract, where=f"{TABLE_NAME} line {entry.line}")
    return None


def _names_for_matching(path: str, table_folder: str) -> tuple:
    """The file's name, and its name relative to the table's folder with forward slashes."""
    full = os.path.abspath(str(path).rstrip("/\\"))
    relative = os.path.relpath(full, table_folder).replace(os.sep, "/")
    return tuple(dict.fromkeys((os.path.basename(full), relative)))


def _entries(table: str) -> list:
    """The table's ``TableLine``s, parsed and compiled once per file version."""
    with open_regular(table) as handle:
        # the version of the file opened, so that what is cached under it is what was read (a table replaced
        # between a stat and the open would otherwise be remembered under the old version)
        version = stat_identity(os.fstat(handle.fileno()))
        cached = _cache.get(table, version)
        if cached is not None:
            return cached
        raw = handle.read(MAX_TABLE_BYTES + 1)
    if len(raw) > MAX_TABLE_BYTES:
        raise ContractError(f"{TABLE_NAME}: larger than the {MAX_TABLE_BYTES} bytes a contract table may have")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ContractError(f"{TABLE_NAME}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    entries = [_compiled(key, contract, line) for key, contract, line in parse_table(text)]
    _cache.put(table, version, entries)
    return entries


def _compiled(key: str, contract: str, line: int) -> TableLine:
    sha = _SHA256.match(key)
    if sha is not None:
        return TableLine(key, contract, line, sha[1], None)
    return TableLine(key, contract, line, None, re.compile(fnmatch.translate(key)).match)


class _Lines:
    """Line numbers of positions met in increasing order, counted once over the text (linear, where counting
    from the start for each entry was quadratic: 28 s for a 1 MB table)."""

    def __init__(self, text: str):
        self.text, self.position, self.line = text, 0, 1

    def at(self, position: int) -> int:
        if position >= self.position:
            self.line += self.text.count("\n", self.position, position)
            self.position = position
        return self.line


def parse_table(text: str) -> list:
    """``[(key, value, line)]`` of a table's text, checking the shape; ContractError naming the line."""
    decoder, lines = json.JSONDecoder(), _Lines(text)
    position = _skip_space(text, 0)
    if not text.startswith("{", position):
        raise ContractError(f"{TABLE_NAME} line {lines.at(position)}: the table must be one JSON object "
                            f"mapping a file name pattern or 'sha256:<hex>' to a contract such as 'steps=4'")
    entries, seen = [], {}
    position = _skip_space(text, position + 1)
    while not text.startswith("}", position):
        line = lines.at(position)
        if len(entries) == MAX_TABLE_ENTRIES:
            raise ContractError(f"{TABLE_NAME} line {line}: more than {MAX_TABLE_ENTRIES} entries; a contract "
                                f"table names files or releases, use patterns for many files")
        key, value, position = _entry(text, position, decoder, line)
        _check_entry(key, value, line, seen)
        entries.append((key, value, line))
        position = _skip_space(text, position)
        if text.startswith(",", position):
            position = _skip_space(text, position + 1)
        elif not text.startswith("}", position):
            raise ContractError(f"{TABLE_NAME} line {lines.at(position)}: expected ',' or '}}'")
    if text[position + 1:].strip():
        raise ContractError(f"{TABLE_NAME} line {lines.at(position + 1)}: text after the table's closing '}}'")
    return entries


def _entry(text: str, position: int, decoder, line: int) -> tuple:
    """``(key, value, position after the value)`` of the entry starting at ``position``."""
    try:
        if not text.startswith('"', position):
            raise ValueError("expected a quoted key")
        key, position = json.decoder.scanstring(text, position + 1)
        position = _skip_space(text, position)
        if not text.startswith(":", position):
            raise ValueError("expected ':' after the key")
        value, position = decoder.raw_decode(text, _skip_space(text, position + 1))
    except ValueError as exc:
        raise ContractError(f"{TABLE_NAME} line {line}: not valid JSON ({exc})") from None
    return key, value, position


def _check_entry(key: str, value, line: int, seen: dict) -> None:
    where = f"{TABLE_NAME} line {line}"
    if key in seen:
        raise ContractError(f"{where}: {key!r} is already given on line {seen[key]}")
    seen[key] = line
    if key.lower().startswith("sha256:") and _SHA256.match(key) is None:
        raise ContractError(f"{where}: {key!r} is not 'sha256:' followed by 64 lowercase hex digits")
    if not key.strip():
        raise ContractError(f"{where}: an empty file name pattern matches nothing")
    if not isinstance(value, str):
        raise ContractError(f"{where}: the contract of {key!r} must be a string such as 'steps=4, shift=5, cfg=1' "
                            f"or 'none', got {json.dumps(value)[:80]}")


def _skip_space(text: str, position: int) -> int:
    while position < len(text) and text[position] in " \t\r\n":
        position += 1
    return position


def _sha256(path: str) -> str:
    """The file's content hash, cached per file version (a table with hashes must not re-read a 1 GB file on
    every question; the version includes the ctime, so a same-size rewrite with its mtime set back is hashed
    again)."""
    real = os.path.realpath(path)
    version = stat_identity(os.stat(real))
    digest = _hash_cache.get(real, version)
    if digest is None:
        digest = file_sha256(real)
        _hash_cache.put(real, version, digest)
    return digest
