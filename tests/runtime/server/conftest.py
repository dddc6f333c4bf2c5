"""The server tests' own fixture: a real server on an ephemeral loopback port with the fake test nodes."""

from __future__ import annotations

import pytest
from server_client import start_server


@pytest.fixture
def server(tmp_path):
    srv = start_server(tmp_path)
    yield srv
    srv.stop()
