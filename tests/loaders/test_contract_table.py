"""The user contract table (``lorabind-contracts.json`` beside the LoRAs): an entry gives a contract to any name;
the file's metadata beats the table and the table beats the name; errors name the table and the line."""

from __future__ import annotations

import hashlib
import json
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import save_file

from lorabind.loaders.contracts import table
from lorabind.loaders.contracts.table import TABLE_NAME, parse_table
from lorabind.loaders.dispatch.contract_discovery import (
    SamplingRequest,
    discover_contract,
    lora_file_contract,
    resolve_schedule,
)
from lorabind.loaders.errors import ContractError
from lorabind.loaders.handles import ModelHandle
from lorabind.loaders.io.file_identity import LatestVersionCache

LIGHTX2V = "wan2.1_t2v_14b_lora_rank64_lightx2v_4step.safetensors"


def write_lora(folder, name, metadata=None):
    tensors = {"diffusion_model.blocks.0.self_attn.q.lora_down.weight": torch.ones(4, 8),
               "diffusion_model.blocks.0.self_attn.q.lora_up.weight": torch.ones(8, 4)}
    path = folder / name
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(path), metadata=metadata)
    return path


def write_table(folder, text):
    (folder / TABLE_NAME).write_text(text, encoding="utf-8")


def test_a_table_entry_gives_a_contract_to_an_arbitrary_name(tmp_path):
    path = write_lora(tmp_path, "my_speedup_v3.safetensors")
    assert discover_contract(str(path)) is None
    write_table(tmp_path, '{\n  "other.safetensors": "steps=8",\n  "my_speedup_*.safetensors": "steps=6, cfg=1"\n}\n')
    contract = discover_contract(str(path))
    assert (contract.steps, contract.shift, contract.cfg, contract.family) == (6, None, 1.0, "wan2.1")  # shift: left out, open
    assert contract.declared_by == f"{TABLE_NAME} line 3"
    assert contract.describe().endswith(f"(declared by {TABLE_NAME} line 3)")
    # the sampler enforces it, and its refusal says where the contract comes from
    handle = ModelHandle(model=SimpleNamespace(family="wan2.1", name="tiny", model_index={}), contracts=(contract,))
    with pytest.raises(ContractError, match=rf"steps must be 6, got 20 \({TABLE_NAME} line 3 declares this contract"):
        resolve_schedule(handle, None, None, SamplingRequest(steps=20, cfg=1.0, shift=5.0))


def test_the_table_beats_the_name_and_none_removes_a_name_contract(tmp_path):
    path = write_lora(tmp_path, LIGHTX2V)
    assert discover_contract(str(path)).steps == 4
    write_table(tmp_path, json.dumps({LIGHTX2V: "steps=8, shift=3"}))
    contract = discover_contract(str(path))
    assert (contract.steps, contract.shift, contract.declared_by) == (8, 3.0, f"{TABLE_NAME} line 1")
    assert contract.note == f"its file name suggests steps=4 shift=5 cfg=1; {TABLE_NAME} line 1 wins"
    write_table(tmp_path, json.dumps({LIGHTX2V: "none"}))
    removed = discover_contract(str(path))
    assert (removed.kind, removed.steps) == ("none", None)


def test_the_files_metadata_beats_the_table(tmp_path):
    path = write_lora(tmp_path, "mine.safetensors", {"sampling_contract": "steps=2"})
    write_table(tmp_path, '{"mine.safetensors": "steps=8"}')
    contract = discover_contract(str(path))
    assert (contract.steps, contract.declared_by) == (2, "metadata")
    assert contract.note == f"{TABLE_NAME} line 1 suggests steps=8 shift=open cfg=open; the metadata wins"


def test_a_sha256_entry_matches_the_content_whatever_the_name(tmp_path):
    path = write_lora(tmp_path, "renamed_download.safetensors")
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    write_table(tmp_path, json.dumps({f"sha256:{digest}": "steps=4"}))
    assert discover_contract(str(path)).steps == 4
    other = write_lora(tmp_path, "other.safetensors", {"x": "different bytes"})
    assert discover_contract(str(other)) is None


def test_a_table_one_folder_up_serves_a_release_folder_and_patterns_may_name_the_folder(tmp_path):
    path = write_lora(tmp_path, "MyRelease/high_noise_model.safetensors")
    write_table(tmp_path, '{"MyRelease/*.safetensors": "steps=3"}')
    assert discover_contract(str(path)).steps == 3
    # the nearest table wins: one in the release folder itself
    write_table(tmp_path / "MyRelease", '{"high_noise_model.safetensors": "steps=5"}')
    assert discover_contract(str(path)).steps == 5


@pytest.mark.parametrize("text, line, words", [
    ('{\n  "a.safetensors": "steps=4",\n  "b.safetensors": 4\n}', 3, "must be a string"),
    ('{\n  "a.safetensors": "steps=four"\n}', 2, "is malformed"),
    ('{\n  "a.safetensors": "steps=1000000000"\n}', 2, "is malformed \\(steps must be 1 to 1000"),
    ('{\n  "a.safetensors": "steps=4, shift=nan"\n}', 2, "is malformed \\('shift=nan' is not a finite"),
    ('{\n  "a.safetensors": "steps=4, cfg=inf"\n}', 2, "is malformed \\('cfg=inf' is not a finite"),
    ('{\n  "a.safetensors": "shift=-inf"\n}', 2, "is malformed \\('shift=-inf' is not a finite"),
    ('{\n  "a.safetensors": "steps=4",\n  "a.safetensors": "steps=8"\n}', 3, "already given on line 2"),
    ('{\n  "sha256:abc": "steps=4"\n}', 2, "64 lowercase hex digits"),
    ('{\n  "a.safetensors": "steps=4"\n  "b.safetensors": "steps=4"\n}', 3, "expected ','"),
    ('[\n  "a.safetensors"\n]', 1, "one JSON object"),
])
def test_table_errors_name_the_table_and_the_line(tmp_path, text, line, words):
    path = write_lora(tmp_path, "a.safetensors")
    write_table(tmp_path, text)
    with pytest.raises(ContractError, match=rf"^{TABLE_NAME} line {line}: .*{words}"):
        discover_contract(str(path))
    # the contract endpoint's declaration refuses it with the same words
    with pytest.raises(ContractError, match=rf"^{TABLE_NAME} line {line}"):
        lora_file_contract(str(path), "a.safetensors")


def test_parse_table_keeps_file_order_and_lines():
    assert parse_table('{"a": "steps=4",\n\n "b*": "none"}') == [("a", "steps=4", 1), ("b*", "none", 3)]


def test_a_step_count_no_sampler_can_run_is_refused_in_metadata_and_ignored_in_a_name(tmp_path):
    """A contract's words are checked before any sigma table is built: 10^9 steps in the metadata is refused naming
    the file and key (it once built a 10^9-point table); a name's count above the sampler's maximum is read as no
    count (a training length), so the release's open contract applies."""
    huge = write_lora(tmp_path, "a.safetensors", {"sampling_contract": "steps=1000000000"})
    with pytest.raises(ContractError, match=r"^a\.safetensors: safetensors metadata .*steps must be 1 to 1000"):
        discover_contract(str(huge))
    assert discover_contract(str(write_lora(tmp_path, LIGHTX2V.replace("4step", "1000steps")))).steps == 1000
    trained = discover_contract(str(write_lora(tmp_path, LIGHTX2V.replace("4step", "3000steps"))))
    assert trained.steps is None and trained.sigmas is None and "steps" in trained.open_fields  # no count read


def test_non_finite_contract_words_in_metadata_are_refused_naming_the_file(tmp_path):
    path = write_lora(tmp_path, "a.safetensors", {"sampling_contract": "steps=4, shift=nan, cfg=inf"})
    with pytest.raises(ContractError, match=r"^a\.safetensors: safetensors metadata .*'shift=nan' is not a finite"):
        discover_contract(str(path))


def _many_entries(count: int) -> str:
    return "{\n" + ",\n".join(f'  "release_{n:05d}_*.safetensors": "steps=4"' for n in range(count)) + "\n}\n"


class _CountingText(str):
    """A table's text that counts the characters its line counting scans."""

    scanned = 0

    def count(self, sub, start=0, end=None):
        end = len(self) if end is None else end
        _CountingText.scanned += max(end - start, 0)
        return super().count(sub, start, end)


def test_a_long_table_parses_in_linear_time_and_its_patterns_compile_once(tmp_path, monkeypatch):
    import fnmatch
    import time

    bound = table.MAX_TABLE_ENTRIES
    text = _CountingText(_many_entries(bound))
    assert len(parse_table(text)) == bound
    assert _CountingText.scanned <= len(text)  # each line counted once (from the start for each entry: 28 s at 1 MB)
    path = write_lora(tmp_path, f"release_{bound - 1:05d}_x.safetensors")
    write_table(tmp_path, text)
    assert discover_contract(str(path)).declared_by == f"{TABLE_NAME} line {bound + 1}"  # the last entry
    compiled = []
    monkeypatch.setattr(fnmatch, "translate", lambda pattern: compiled.append(pattern) or ".*")
    started = time.perf_counter()
    for _ in range(3):
        assert discover_contract(str(path)).steps == 4
    assert compiled == [] and (time.perf_counter() - started) / 3 < 1.0  # no pattern compiled again


def test_a_table_past_the_entry_cap_is_refused_naming_the_line(tmp_path):
    bound = table.MAX_TABLE_ENTRIES
    assert len(parse_table(_many_entries(bound))) == bound
    with pytest.raises(ContractError, match=rf"^{TABLE_NAME} line {bound + 2}: more than {bound} entries"):
        parse_table(_many_entries(bound + 1))


def test_a_sha256_entry_stops_matching_when_the_bytes_change_with_the_same_size_and_mtime(tmp_path):
    import os

    path = write_lora(tmp_path, "renamed_download.safetensors")
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    write_table(tmp_path, json.dumps({f"sha256:{digest}": "steps=4"}))
    assert discover_contract(str(path)).steps == 4
    stat = os.stat(path)
    data = bytearray(path.read_bytes())
    data[-1] ^= 1  # the last byte of the last tensor: same size, other content
    path.write_bytes(bytes(data))
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert os.stat(path).st_size == stat.st_size and os.stat(path).st_mtime_ns == stat.st_mtime_ns
    assert discover_contract(str(path)) is None


def test_the_table_and_hash_caches_keep_one_version_per_path_and_a_bounded_number_of_paths(tmp_path, monkeypatch):
    monkeypatch.setattr(table, "_hash_cache", LatestVersionCache(max_paths=3))
    paths = [write_lora(tmp_path, f"download_{i}.safetensors", {"copy": str(i)}) for i in range(5)]
    digests = [hashlib.sha256(p.read_bytes()).hexdigest() for p in paths]
    write_table(tmp_path, json.dumps({f"sha256:{d}": "steps=4" for d in digests}))
    assert [discover_contract(str(p)).steps for p in paths] == [4] * 5
    assert len(table._hash_cache) == 3  # the two asked first were dropped
    rewritten = paths[-1]
    rewritten.write_bytes(rewritten.read_bytes()[:-1] + bytes([rewritten.read_bytes()[-1] ^ 1]))
    assert discover_contract(str(rewritten)) is None  # hashed again: no entry matches the new content
    assert len(table._hash_cache) == 3  # the old version of that path replaced, not kept beside it


def test_latest_version_cache_answers_only_the_version_it_holds():
    cache = LatestVersionCache(max_paths=2)
    cache.put("a", (1,), "a1")
    assert cache.get("a", (1,)) == "a1" and cache.get("a", (2,)) is None
    cache.put("b", (1,), "b1")
    assert cache.get("a", (1,)) == "a1"  # asked last: "b" is now the least recently used
    cache.put("c", (1,), "c1")
    assert (cache.get("a", (1,)), cache.get("b", (1,)), cache.get("c", (1,))) == ("a1", None, "c1")


def test_a_lookup_past_its_deadline_stops_hashing(tmp_path):
    from lorabind.loaders.contracts.baked import file_sha256
    from lorabind.loaders.io.read_deadline import DeadlinePassed, read_deadline

    path = tmp_path / "big.safetensors"
    path.write_bytes(b"\0" * (8 << 20))
    with read_deadline(0.0, "reading 'big.safetensors'"), pytest.raises(DeadlinePassed, match="was stopped"):
        file_sha256(str(path))
    assert file_sha256(str(path)) == hashlib.sha256(b"\0" * (8 << 20)).hexdigest()  # no deadline: the whole file
