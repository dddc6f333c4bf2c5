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
from typing import Optional

from ..errors import ContractError
from .baked import file_sha256

TABLE_NAME = "lorabind-contracts.json"
MAX_TABLE_BYTES = 1 << 20  # a list of names, not a data set: a larger file is refused, not read
_SHA256 = re.compile(r"^sha256:([0-9a-f]{64})$")
_cache: dict = {}  # table path -> ((mtime_ns, size), entries)
_hash_cache: dict = {}  # (real path, mtime_ns, size) -> sha256


@dataclass(frozen=True)
class TableEntry:
    """One matching table line: the contract text and where it was written (``lorabind-contracts.json line
    3``: no local path, so it can be shown in the browser)."""

    contract: str
    where: str


def table_entry(path: str) -> Optional[TableEntry]:
    """The entry of the nearest contract table that matches the LoRA at ``path``, or None."""
    folder = os.path.dirname(os.path.abspath(str(path).rstrip("/\\")))
    for table_folder in (folder, os.path.dirname(folder)):
        table = os.path.join(table_folder, TABLE_NAME)
        if not os.path.isfile(table):
            continue
        entries = _entries(table)
        names = _names_for_matching(path, table_folder)
        digest = None
        for key, contract, line in entries:
            sha = _SHA256.match(key)
            if sha is not None:
                digest = digest or _sha256(path)
                matched = sha[1] == digest
            else:
                matched = any(fnmatch.fnmatchcase(name, key) for name in names)
            if matched:
                return TableEntry(contract=contract, where=f"{TABLE_NAME} line {line}")
    return None


def _names_for_matching(path: str, table_folder: str) -> tuple:
    """The file's name, and its name relative to the table's folder with forward slashes."""
    full = os.path.abspath(str(path).rstrip("/\\"))
    relative = os.path.relpath(full, table_folder).replace(os.sep, "/")
    return tuple(dict.fromkeys((os.path.basename(full), relative)))


def _entries(table: str) -> list:
    """``[(key, contract text, line)]`` of a table, parsed once per (mtime, size)."""
    stat = os.stat(table)
    stamp = (stat.st_mtime_ns, stat.st_size)
    cached = _cache.get(table)
    if cached is not None and cached[0] == stamp:
        return cached[1]
    if stat.st_size > MAX_TABLE_BYTES:
        raise ContractError(f"{TABLE_NAME}: {stat.st_size} bytes is larger than the {MAX_TABLE_BYTES} bytes a "
                            f"contract table may have")
    with open(table, encoding="utf-8") as handle:
        text = handle.read()
    entries = parse_table(text)
    _cache[table] = (stamp, entries)
    return entries


def parse_table(text: str) -> list:
    """``[(key, value, line)]`` of a table's text, checking the shape; ContractError naming the line."""
    decoder = json.JSONDecoder()
    position = _skip_space(text, 0)
    if not text.startswith("{", position):
        raise ContractError(f"{TABLE_NAME} line {_line(text, position)}: the table must be one JSON object "
                            f"mapping a file name pattern or 'sha256:<hex>' to a contract such as 'steps=4'")
    entries, seen = [], {}
    position = _skip_space(text, position + 1)
    while not text.startswith("}", position):
        line = _line(text, position)
        try:
            key, position = json.decoder.scanstring(text, position + 1) if text.startswith('"', position) else \
                (None, position)
            if key is None:
                raise ValueError("expected a quoted key")
            position = _skip_space(text, position)
            if not text.startswith(":", position):
                raise ValueError("expected ':' after the key")
            value, position = decoder.raw_decode(text, _skip_space(text, position + 1))
        except ValueError as exc:
            raise ContractError(f"{TABLE_NAME} line {line}: not valid JSON ({exc})") from None
        _check_entry(key, value, line, seen)
        entries.append((key, value, line))
        position = _skip_space(text, position)
        if text.startswith(",", position):
            position = _skip_space(text, position + 1)
        elif not text.startswith("}", position):
            raise ContractError(f"{TABLE_NAME} line {_line(text, position)}: expected ',' or '}}'")
    if text[position + 1:].strip():
        raise ContractError(f"{TABLE_NAME} line {_line(text, position + 1)}: text after the table's closing '}}'")
    return entries


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


def _line(text: str, position: int) -> int:
    return text.count("\n", 0, position) + 1


def _sha256(path: str) -> str:
    """The file's content hash (cached per file version: a table with hashes must not re-read a 1 GB file on
    every question)."""
    real = os.path.realpath(path)
    stat = os.stat(real)
    key = (real, stat.st_mtime_ns, stat.st_size)
    if key not in _hash_cache:
        _hash_cache[key] = file_sha256(real)
    return _hash_cache[key]
