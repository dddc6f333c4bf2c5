"""Unit checks of the queue ordering and the persisted history (no HTTP)."""

from __future__ import annotations

import json

from lorabind.runtime.server.history import HistoryStore
from lorabind.runtime.server.queue import PromptQueue, QueueItem


def _item(queue: PromptQueue, pid: str, number=None, front=False) -> QueueItem:
    return QueueItem(queue.next_number(number, front), pid, {}, {}, [])


def test_queue_runs_by_number_front_first_ties_by_arrival():
    changes = []
    queue = PromptQueue(on_change=lambda: changes.append(queue.remaining()))
    for pid in ("a", "b"):
        queue.put(_item(queue, pid))
    queue.put(_item(queue, "front", front=True))
    queue.put(_item(queue, "explicit", number=0.5))
    queue.put(_item(queue, "tie", number=0))
    _, pending = queue.snapshot()
    assert [(p[0], p[1]) for p in pending] == [(-2, "front"), (0, "a"), (0.0, "tie"), (0.5, "explicit"),
                                               (1, "b")]
    assert changes == [1, 2, 3, 4, 5]
    first = queue.get(timeout=1)
    assert first.prompt_id == "front" and queue.snapshot()[0][0][1] == "front"
    assert queue.delete(["tie", "not-there", "front"]) == 1  # the running one is not deleted
    assert [p[1] for p in queue.snapshot()[1]] == ["a", "explicit", "b"]
    queue.task_done()
    assert queue.running is None and queue.remaining() == 3
    assert queue.clear() == 3 and queue.remaining() == 0
    assert queue.get(timeout=0.05) is None
    queue.put(_item(queue, "late"))
    queue.close()
    assert queue.get(timeout=1) is None and queue.closed


def _entry(n: int) -> dict:
    return {"prompt": [n, f"p{n}", {}, {}, []], "outputs": {}, "status": {"status_str": "success",
                                                                          "completed": True, "messages": []},
            "meta": {}}


def test_history_persists_in_order_trims_and_survives_a_corrupt_file(tmp_path):
    folder = tmp_path / "history"
    store = HistoryStore(folder, max_size=3)
    for n in range(4):
        store.add(f"p{n}", _entry(n))
    store.add("p1", _entry(11))  # re-adding moves it to the end, as a fresh result
    assert list(store.list()) == ["p2", "p3", "p1"]
    assert len(list(folder.glob("*.json"))) == 3

    reopened = HistoryStore(folder, max_size=3)
    assert list(reopened.list()) == ["p2", "p3", "p1"]
    assert reopened.get("p1")["p1"]["prompt"][0] == 11
    assert list(reopened.list(max_items=2)) == ["p3", "p1"]
    assert list(reopened.list(max_items=1, offset=0)) == ["p2"]

    victim = next(p for p in folder.glob("*.json") if json.loads(p.read_text())["prompt_id"] == "p3")
    victim.write_text('{"seq": 1, "prompt_id": "p3", "entry": {trunc')
    survived = HistoryStore(folder)
    assert list(survived.list()) == ["p2", "p1"]
    assert victim.with_suffix(".corrupt").exists()
    survived.delete(["p2"])
    assert list(HistoryStore(folder).list()) == ["p1"]
    survived.clear()
    assert HistoryStore(folder).list() == {} and list(folder.glob("*.json")) == []
