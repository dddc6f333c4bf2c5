"""Issue 31: contract lookups run in a worker pool with a timeout and are cached by file identity, refusals
included, in a bounded cache; hostile LoRAs are refused within the header budget."""

from __future__ import annotations

import asyncio
import os
import threading
import time

from contract_endpoint import ask_contracts
from hostile_files import write_huge_header, write_many_tensors
from lorabind.nodes import contract_lookups
from lorabind.nodes.contract_lookups import LOOKUPS, ContractLookups


def test_hostile_loras_are_refused_once_and_then_answered_from_the_cache(registry_at, tmp_path):
    loras = tmp_path / "models" / "loras"
    loras.mkdir(parents=True)
    write_huge_header(loras / "huge-header.safetensors")
    write_many_tensors(loras / "many-tensors.safetensors")
    registry_at(tmp_path / "models")
    reads = LOOKUPS.reads
    answers = ask_contracts(["huge-header.safetensors", "many-tensors.safetensors"] * 5)
    assert LOOKUPS.reads == reads + 2  # each file read once; four more asks each were cache hits
    assert {status for status, _ in answers} == {422}
    assert "safetensors header is over the 33554432-byte budget" in answers[0][1]["reason"]
    assert "safetensors header lists 100001 tensors, over the budget" in answers[1][1]["reason"]
    assert str(tmp_path) not in str(answers)
    stat = os.stat(loras / "many-tensors.safetensors")
    os.utime(loras / "many-tensors.safetensors", ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    ask_contracts(["many-tensors.safetensors"])
    assert LOOKUPS.reads == reads + 3  # a changed file is read again


def test_the_loras_folder_itself_is_no_name(registry_at, tmp_path):
    (tmp_path / "models" / "loras").mkdir(parents=True)
    registry_at(tmp_path / "models")
    for name in (".", "./", "a/.."):
        (status, body), = ask_contracts([name])
        assert status == 400 and body["contract"] is None, (name, body)
        assert "not the folder itself" in body["reason"] or "'..'" in body["reason"]


def _files(tmp_path, count: int) -> list[str]:
    paths = []
    for n in range(count):
        path = tmp_path / f"f{n}.safetensors"
        path.write_bytes(b"x")
        paths.append(str(path))
    return paths


def test_concurrent_lookups_share_one_read_and_a_slow_one_times_out(tmp_path, monkeypatch):
    monkeypatch.setattr(contract_lookups, "TIMEOUT_S", 0.3)
    lookups, calls, release = ContractLookups(), [], threading.Event()
    path, = _files(tmp_path, 1)

    def slow_declaration(path: str, name: str) -> dict:
        calls.append(name)
        release.wait(10)
        return {"file": name, "contract": None}

    async def run():
        answers = await asyncio.gather(*(lookups.answer("loras", "f0", path, slow_declaration) for _ in range(3)))
        release.set()
        time.sleep(0.1)  # the read finishes in the background and is cached
        return answers, await lookups.answer("loras", "f0", path, slow_declaration)

    timed_out, later = asyncio.run(run())
    assert [status for status, _ in timed_out] == [503] * 3 and "longer than 0.3 s" in timed_out[0][1]["reason"]
    assert later == (200, {"file": "f0", "contract": None}) and calls == ["f0"]


def test_the_cache_is_bounded(tmp_path, monkeypatch):
    monkeypatch.setattr(contract_lookups, "MAX_ENTRIES", 5)
    lookups = ContractLookups()

    async def run(paths):
        for path in paths:
            await lookups.answer("loras", os.path.basename(path), path, lambda p, n: {"file": n})

    asyncio.run(run(_files(tmp_path, 12)))
    assert len(lookups._answers) == 5 and lookups.reads == 12


def test_a_contract_table_added_or_edited_later_changes_the_cached_answer(registry_at, tmp_path):
    loras = tmp_path / "models" / "loras"
    loras.mkdir(parents=True)
    (loras / "my_speedup.safetensors").write_bytes(_tiny_lora_bytes())
    registry_at(tmp_path / "models")
    (status, body), = ask_contracts(["my_speedup.safetensors"])
    assert status == 200 and body["contract"] is None
    (loras / "lorabind-contracts.json").write_text('{"my_speedup.safetensors": "steps=6"}')
    (status, body), = ask_contracts(["my_speedup.safetensors"])
    assert status == 200 and body["contract"]["steps"] == 6, body  # as /prompt enforces it
    (loras / "lorabind-contracts.json").write_text('{"my_speedup.safetensors": "steps=8"}')
    assert ask_contracts(["my_speedup.safetensors"])[0][1]["contract"]["steps"] == 8


def test_a_sha256_entry_is_matched_again_after_a_rewrite_with_the_same_size_and_mtime(registry_at, tmp_path):
    import hashlib

    loras = tmp_path / "models" / "loras"
    loras.mkdir(parents=True)
    path = loras / "download.safetensors"
    path.write_bytes(_tiny_lora_bytes())
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    (loras / "lorabind-contracts.json").write_text(f'{{"sha256:{digest}": "steps=6"}}')
    registry_at(tmp_path / "models")
    assert ask_contracts(["download.safetensors"])[0][1]["contract"]["steps"] == 6
    stat = os.stat(path)
    data = bytearray(path.read_bytes())
    data[-1] ^= 1  # same size, other content, the mtime set back
    path.write_bytes(bytes(data))
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    (status, body), = ask_contracts(["download.safetensors"])
    assert status == 200 and body["contract"] is None


def _tiny_lora_bytes() -> bytes:
    import torch
    from safetensors.torch import save

    return save({"diffusion_model.blocks.0.self_attn.q.lora_down.weight": torch.ones(4, 8),
                 "diffusion_model.blocks.0.self_attn.q.lora_up.weight": torch.ones(8, 4)})


def test_a_lookup_that_times_out_stops_its_work_and_caches_nothing(tmp_path, monkeypatch):
    from lorabind.loaders.io.read_deadline import check_deadline

    monkeypatch.setattr(contract_lookups, "TIMEOUT_S", 0.3)
    lookups, steps = ContractLookups(), []
    path, = _files(tmp_path, 1)

    def endless_declaration(path: str, name: str) -> dict:
        while True:  # work that would run on allocating: it checks the deadline, as the long loops do
            check_deadline()
            steps.append(bytearray(1024))
            time.sleep(0.01)

    async def run():
        answer = await lookups.answer("loras", "f0", path, endless_declaration)
        await asyncio.sleep(0.2)
        return answer

    status, body = asyncio.run(run())
    assert status == 503 and "longer than 0.3 s" in body["reason"]
    done = len(steps)
    time.sleep(0.2)
    assert len(steps) == done and lookups._running == {} and len(lookups._answers) == 0  # stopped, nothing kept
