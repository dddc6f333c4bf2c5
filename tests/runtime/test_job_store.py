"""The job's store (``runtime/parallel/job_store.py``) on a real TCPStore over loopback, against a client that does
not hold the job's secret (issue 52, item 1).

What such a client can do, and what the tests hold: it can connect (loopback only: the store listens nowhere
else), list the keys and read the values (signed, not secret), but nothing it writes is taken by a rank, whether
unsigned, signed with another secret, or put at the plain names the channel used before (``cmd0``); each foreign
value is reported once by key. A rank of another job (another secret) cannot join this one.
"""

from __future__ import annotations

import logging
import threading
import time
from datetime import timedelta

import pytest
import torch.distributed as dist

from lorabind.loaders.distributed.process_group import ParallelRunError
from lorabind.runtime.parallel.job_store import JobStore
from lorabind.runtime.parallel.launch import free_port
from lorabind.runtime.parallel.prompt_channel import Lockstep, PromptChannel, RankFailed

SECRET = b"the job's secret, at least 16 characters"
OTHER = b"another job's secret, also long enough"


@pytest.fixture
def hosted():
    store = JobStore.host(SECRET, "127.0.0.1", timeout_s=10.0)
    yield store


def _foreign(store: JobStore):
    """A plain TCPStore client of the same port: what any local process can open."""
    return dist.TCPStore("127.0.0.1", store.port, None, False, timedelta(seconds=5))


def _listening_address(port: int) -> list[str]:
    """The local addresses of the LISTEN sockets on ``port`` (/proc/net/tcp and tcp6; state 0A)."""
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as handle:
            for line in list(handle)[1:]:
                local, state = line.split()[1], line.split()[3]
                address, hex_port = local.rsplit(":", 1)
                if state == "0A" and int(hex_port, 16) == port:
                    found.append(address)
    return found


def test_the_store_listens_on_loopback_only(hosted):
    assert _listening_address(hosted.port) == ["0100007F"]  # 127.0.0.1, and no :: or 0.0.0.0 socket


def test_a_client_without_the_secret_can_read_but_nothing_it_writes_is_taken(hosted, caplog):
    hosted.set("cmd0", {"kind": "prompt", "prompt": {"1": {}}})
    foreign = _foreign(hosted)
    keys = foreign.list_keys()
    assert len(keys) == 1 and keys[0].endswith("/cmd0") and keys[0] != "cmd0"  # under the secret's prefix
    assert b'"prompt"' in foreign.get(keys[0])  # signed, not encrypted: why no token ever enters the store

    foreign.set("cmd1", '{"kind": "free", "unload": true}')  # the old attack: the plain key name
    prefix = keys[0][:-len("cmd0")]
    foreign.set(prefix + "cmd2", '{"kind": "free", "unload": true}')  # unsigned, at the real name
    forged = JobStore(foreign, OTHER)
    foreign.set(prefix + "cmd3", forged._signature("cmd3", b'{"kind": "stop"}') + b':{"kind": "stop"}')
    with caplog.at_level(logging.WARNING, logger="lorabind.parallel"):
        assert [hosted.peek(f"cmd{n}") for n in range(4)] == [{"kind": "prompt", "prompt": {"1": {}}}, None, None,
                                                                None]
        hosted.peek("cmd2")  # the same foreign value again: reported once
    reports = [r.getMessage() for r in caplog.records]
    assert len(reports) == 2 and all("not signed with this job's secret" in r for r in reports)
    assert f"{prefix}cmd2" in reports[0] and f"{prefix}cmd3" in reports[1]


def test_a_value_moved_to_another_key_is_refused(hosted):
    """The signature covers the key: a rank's own signed value copied under another key is not taken there."""
    hosted.set("p0/at0/go", {"do": "go"})
    foreign = _foreign(hosted)
    key = next(k for k in foreign.list_keys() if k.endswith("p0/at0/go"))
    foreign.set(key.replace("at0", "at1"), foreign.get(key))
    assert hosted.peek("p0/at0/go") == {"do": "go"} and hosted.peek("p0/at1/go") is None


def test_a_follower_ignores_a_forged_command_and_takes_the_real_one(hosted):
    leader = PromptChannel(hosted, 0, 2, 5.0)
    follower = PromptChannel(JobStore.connect(SECRET, "127.0.0.1", hosted.port, 5.0), 1, 2, 5.0)
    prefix = hosted.prefix
    foreign = _foreign(hosted)
    foreign.set(prefix + "cmd0", b'xx:{"kind": "prompt", "prompt": {"evil": {}}}')
    received = []
    thread = threading.Thread(target=lambda: received.append(follower.receive()))
    thread.start()
    time.sleep(0.3)
    assert received == []  # the forged command is not taken; the follower waits on
    leader.send({"kind": "prompt", "prompt": {"1": {}}})
    thread.join(10)
    assert received == [(0, {"kind": "prompt", "prompt": {"1": {}}})]


def test_a_forged_decision_does_not_move_a_rank_past_a_sync_point(hosted):
    follower = PromptChannel(JobStore.connect(SECRET, "127.0.0.1", hosted.port, 5.0), 1, 2, 0.5)
    foreign = _foreign(hosted)
    foreign.set(hosted.prefix + "p0/at0/go", b'0000:{"do": "go"}')
    with pytest.raises(RankFailed, match="rank 0 did not decide past the executing of node 1 within 0.5 s"):
        Lockstep(follower, 0).checkpoint("executing of node 1")


def test_a_rank_with_another_secret_does_not_join_and_the_wait_names_it(hosted):
    stranger = JobStore.connect(OTHER, "127.0.0.1", hosted.port, 5.0)
    stranger.set("joined/r1", {"pid": 1, "host": "elsewhere"})
    started = time.monotonic()
    with pytest.raises(ParallelRunError, match=r"rank\(s\) 1 of 2 did not join within 0.5 s .*LORABIND_JOB_SECRET"):
        hosted.meet(0, 2, 0.5)
    assert time.monotonic() - started < 5


def test_ranks_of_one_secret_meet_and_learn_each_others_process():
    stores = [JobStore.host(SECRET, "127.0.0.1", 10.0)]
    stores.append(JobStore.connect(SECRET, "127.0.0.1", stores[0].port, 5.0))
    met: list = [None, None]
    threads = [threading.Thread(target=lambda r=r: met.__setitem__(r, stores[r].within("g1").meet(r, 2, 10)))
               for r in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(15)
    assert met[0] == met[1] and sorted(met[0]) == [0, 1] and all("pid" in peer for peer in met[0].values())


def test_nobody_at_the_port_is_one_line_within_the_bound():
    with pytest.raises(ParallelRunError) as refused:
        JobStore.connect(SECRET, "127.0.0.1", free_port(), 1.0)
    assert str(refused.value).startswith("nobody answers at MASTER_ADDR:MASTER_PORT 127.0.0.1:")
    assert "\n" not in str(refused.value)
