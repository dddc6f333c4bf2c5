"""Unit checks of the queue ordering and the persisted history (no HTTP)."""

from __future__ import annotations

import json
import threading
import time

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


def test_background_work_waits_for_an_idle_queue_and_holds_the_next_prompt_back_while_it_runs():
    """Issue 54: the template thumbnails render below the user's prompts. ``while_idle`` starts only when nothing is
    pending, running or being validated; a prompt queued while it runs waits for that one piece only, and the
    queue says what it waits for."""
    queue = PromptQueue()
    order, started, release = [], threading.Event(), threading.Event()

    def thumbnail(name: str):
        def work():
            order.append(f"{name} started")
            started.set()
            assert release.wait(5)
            order.append(f"{name} done")
            return "rendered"
        return lambda: queue.while_idle(f"template thumbnail {name}", work)

    queue.put(_item(queue, "user-1"))
    first = threading.Thread(target=thumbnail("a"))
    first.start()
    time.sleep(0.2)
    assert not started.is_set() and queue.background is None  # a prompt is pending: the thumbnail waits
    running = queue.get(timeout=1)
    time.sleep(0.2)
    assert running.prompt_id == "user-1" and not started.is_set()  # ... and while it runs
    order.append("user-1 done")
    queue.task_done(running)
    assert started.wait(5) and queue.background == "template thumbnail a"
    queue.put(_item(queue, "user-2"))  # queued while the thumbnail renders: held back until it returns
    assert queue.get(timeout=0.3) is None and queue.snapshot()[1][0][1] == "user-2"
    assert queue.claim("user-3")  # a prompt being validated also keeps the next thumbnail from starting
    release.set()
    first.join(5)
    second = threading.Thread(target=thumbnail("b"))
    second.start()
    assert queue.get(timeout=5).prompt_id == "user-2" and queue.background is None
    order.append("user-2 done")
    queue.task_done()
    time.sleep(0.2)
    assert "b started" not in order  # user-3 is still being validated
    queue.release("user-3")
    second.join(5)
    assert order == ["user-1 done", "a started", "a done", "user-2 done", "b started", "b done"]
    queue.close()
    assert queue.while_idle("template thumbnail c", lambda: order.append("c")) is None and "c" not in order


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
