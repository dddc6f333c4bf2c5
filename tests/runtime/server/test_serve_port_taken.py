"""A second ``lorabind serve`` on a taken port: one line naming the port and ``--port``, a non-zero exit, and no
banner (the port is bound before anything is announced or built)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lorabind.runtime.listen import PortUnavailable, bind_listeners, listening_port

PARALLEL_BOUND_S = 5.0  # issue 53: serve --parallel on a taken port (on main: 51 s, inside two tracebacks)


def _serve_on_taken_port(tmp_path, *extra) -> tuple[subprocess.CompletedProcess, int, float]:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        package_parent = str(Path(__file__).resolve().parents[3])
        env = {**os.environ,
               "PYTHONPATH": os.pathsep.join(filter(None, [package_parent, os.environ.get("PYTHONPATH")]))}
        started = time.monotonic()
        done = subprocess.run([sys.executable, "-m", "lorabind.runtime.cli", "serve", "--port", str(port),
                               "--models", str(tmp_path / "models"), "--output", str(tmp_path / "out"), *extra],
                              cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
        return done, port, time.monotonic() - started


@pytest.mark.parametrize("extra", [(), ("--parallel", "ulysses=2")])
def test_a_taken_port_is_one_line_with_the_way_out_and_no_banner(tmp_path, extra):
    done, port, elapsed = _serve_on_taken_port(tmp_path, *extra)
    lines = (done.stdout + done.stderr).strip().splitlines()
    assert done.returncode != 0
    assert len(lines) == 1, lines
    assert f"127.0.0.1:{port}" in lines[0] and "--port" in lines[0]
    assert "http://" not in lines[0] and "Traceback" not in lines[0] and "starting" not in lines[0]
    assert not (tmp_path / "models").exists()  # refused before any example model was built
    if extra:  # no rank was started: the sockets are bound before torch is imported
        print(f"serve --parallel on a taken port: refused in {elapsed:.2f} s (the interpreter's start included)")
        assert elapsed < PARALLEL_BOUND_S


def test_the_sockets_are_bound_before_serving_and_port_zero_takes_one_port_for_every_address():
    listeners = bind_listeners(["127.0.0.1"], 0)
    try:
        port = listening_port(listeners)
        assert port > 0
        with pytest.raises(PortUnavailable, match=rf"127\.0\.0\.1:{port}: .*--port"):
            bind_listeners(["127.0.0.1"], port)
    finally:
        for listener in listeners:
            listener.close()
