"""``load_test.py --hostile``, issue 52's item 1: the attacks on a ``serve --parallel ulysses=2`` job's rank
channel, as a process outside the job makes them, with what each one got.

- the job's listening sockets (from /proc, what ``ss -ltnp`` shows): how many, and how many beyond loopback;
- a connect to the HTTP port and to the job's store from this host's non-loopback address (refused: nothing
  listens there);
- a store client on loopback without the job's secret, while a prompt carrying comfy.org tokens runs: the keys it
  lists and the values it reads (no token), and the commands it forges, unsigned and at the plain names (the
  prompts still succeed, and the ranks report the forgeries);
- the prompt's wall time with the foreign client at work, against the same prompt without it.

Run by ``python -m bench.load_test --hostile`` (or ``python -m bench.hostile_ranks``), on a temporary root.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from datetime import timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TEMPLATE = ROOT / "workflows" / "api" / "qwen_image_lightning.api.json"
TOKENS = {"auth_token_comfy_org": "bench-comfy-org-token", "api_key_comfy_org": "bench-comfy-org-key"}
STEPS = 40  # a prompt long enough for the foreign client to look while it runs


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _tree(pid: int) -> list[int]:
    pids, parents = [pid], {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parents[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
    for child, parent in parents.items():
        if parent == pid:
            pids.extend(_tree(child))
    return pids


def _listening(pids: list[int]) -> list[tuple[str, int]]:
    inodes = set()
    for pid in pids:
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            target = os.readlink(fd) if fd.is_symlink() else ""
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            address, port = fields[1].rsplit(":", 1)
            if fields[3] == "0A" and fields[9] in inodes:
                found.append((address, int(port, 16)))
    return found


def _is_loopback_hex(address: str) -> bool:
    return address.endswith("7F") and len(address) == 8 or address == "00000000000000000000000001000000"


def _outbound_address() -> str | None:
    """This host's address toward the network (a UDP connect sends nothing)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect(("192.0.2.1", 9))
            address = probe.getsockname()[0]
    except OSError:
        return None
    return None if address.startswith("127.") else address


def _refused(address: str, port: int) -> str:
    started = time.perf_counter()
    try:
        socket.create_connection((address, port), timeout=2).close()
    except OSError as exc:
        return f"refused ({exc.strerror or exc}) in {(time.perf_counter() - started) * 1000:.1f} ms"
    return "ACCEPTED"


def _queue(url: str, steps: int, extra: dict, seed: int = 0) -> str:
    """The template without its distill LoRA (any step count); a seed of its own, so nothing is a cache hit."""
    prompt = json.loads(TEMPLATE.read_text())
    prompt["6"]["inputs"].update(model=["1", 0], steps=steps, seed=seed)
    body = json.dumps({"prompt": prompt, "extra_data": extra}).encode()
    request = urllib.request.Request(url + "/prompt", body, {"Content-Type": "application/json"})
    return json.load(urllib.request.urlopen(request, timeout=60))["prompt_id"]


def _finished(url: str, prompt_id: str, timeout: float = 600) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        history = json.load(urllib.request.urlopen(f"{url}/history/{prompt_id}", timeout=30))
        if prompt_id in history:
            return history[prompt_id]["status"]["status_str"]
        time.sleep(0.1)
    return "timed out"


def _foreign_client_at_work(url: str, store_port: int) -> dict:
    """A prompt with comfy.org tokens while a TCPStore client without the secret lists, reads and forges."""
    import torch.distributed as dist

    foreign = dist.TCPStore("127.0.0.1", store_port, None, False, timedelta(seconds=10))
    started = time.perf_counter()
    prompt_id = _queue(url, STEPS, TOKENS, seed=2)
    keys, values, forged = set(), [], 0
    while True:
        listed = foreign.list_keys()
        keys.update(listed)
        values.extend(bytes(foreign.compare_set(key, "\0", "\0")) for key in listed)
        commands = [key for key in listed if key.rsplit("/", 1)[-1].startswith("cmd")]
        for key in commands:
            number = int(key.rsplit("cmd", 1)[1]) + 1
            foreign.set(key.rsplit("cmd", 1)[0] + f"cmd{number}", '{"kind": "stop"}')
            foreign.set(f"cmd{number}", '{"kind": "free", "unload": true}')
            forged += 2
        history = json.load(urllib.request.urlopen(f"{url}/history/{prompt_id}", timeout=30))
        if prompt_id in history:
            break
        time.sleep(0.05)
    elapsed = time.perf_counter() - started
    leaked = sum(token.encode() in value for value in values for token in TOKENS.values())
    return {"keys": len(keys), "values": len(values), "leaked": leaked, "forged": forged, "elapsed": elapsed,
            "status": history[prompt_id]["status"]["status_str"], "next": _finished(url, _queue(url, 4, {}, seed=3))}


def measure_hostile_ranks(timeout: float = 900.0) -> int:
    with tempfile.TemporaryDirectory(prefix="lorabind-hostile-ranks-") as tmp:
        port = _free_port()
        url = f"http://127.0.0.1:{port}"
        log = Path(tmp) / "serve.log"
        command = [sys.executable, "-m", "lorabind.runtime.cli", "serve", "--port", str(port), "--models",
                   os.path.join(tmp, "models"), "--output", os.path.join(tmp, "output"), "--input",
                   os.path.join(tmp, "input"), "--temp", os.path.join(tmp, "temp"), "--parallel", "ulysses=2"]
        with open(log, "w") as out:
            server = subprocess.Popen(command, stdout=out, stderr=out, start_new_session=True)
        try:
            return _measure(url, server, log, timeout)
        finally:
            if server.poll() is None:
                server.send_signal(signal.SIGINT)
                try:
                    server.wait(60)
                except subprocess.TimeoutExpired:
                    os.killpg(server.pid, signal.SIGKILL)


def _measure(url: str, server: subprocess.Popen, log: Path, timeout: float) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(url + "/system_stats", timeout=2).close()
            break
        except OSError:
            time.sleep(0.5)
    _finished(url, _queue(url, 4, {}))  # the examples' models built and loaded, outside the figures
    pids = _tree(server.pid)
    sockets = _listening(pids)
    beyond = [s for s in sockets if not _is_loopback_hex(s[0])]
    store_port = int(dict(item.split("=", 1) for item in Path(f"/proc/{pids[1]}/environ").read_bytes().decode()
                          .split("\0") if "=" in item)["MASTER_PORT"])
    http_port = int(url.rsplit(":", 1)[1])
    started = time.perf_counter()
    _finished(url, _queue(url, STEPS, TOKENS, seed=1))
    alone_s = time.perf_counter() - started
    attack = _foreign_client_at_work(url, store_port)
    attacked_s = attack["elapsed"]
    outbound = _outbound_address()
    print("hostile rank channel (issue 52, item 1), serve --parallel ulysses=2 on loopback:")
    print(f"  listening sockets of the job's {len(pids)} processes: {len(sockets)}, beyond loopback: {len(beyond)}")
    if outbound:
        print(f"  from {outbound}: HTTP port {_refused(outbound, http_port)}; the job's store "
              f"{_refused(outbound, store_port)}")
    else:
        print("  no non-loopback address on this host: the connect from outside was not tried")
    print(f"  a store client without the secret: {attack['keys']} keys listed, {attack['values']} values read, "
          f"comfy.org tokens found {attack['leaked']}; {attack['forged']} commands forged")
    print(f"  the prompt under attack: {attack['status']}; the next prompt: {attack['next']}; forgeries reported "
          f"by the ranks: {log.read_text(errors='replace').count('not signed with this job')} lines")
    print(f"  the {STEPS}-step prompt: {alone_s:.1f} s alone, {attacked_s:.1f} s with the foreign client at work "
          f"(x{attacked_s / alone_s:.2f})")
    ok = not beyond and attack["leaked"] == 0 and attack["status"] == attack["next"] == "success"
    print("  OK" if ok else "  FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(measure_hostile_ranks())
