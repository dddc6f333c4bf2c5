"""The served editor makes no request that leaves the machine (issue 54 item 5): every request the page makes is
recorded at the network layer while it opens, runs the main example, runs a refused workflow and shows the
Issues panel ("See errors"), and none may go anywhere but the server on 127.0.0.1.

What went out before: opening the Issues panel asked the Comfy registry
(``https://api.comfy.org/nodes?node_id=lorabind&node_id=comfy-core``) which pack each node of the workflow comes
from. The server's page now carries a Content-Security-Policy whose ``connect-src`` is the server itself
(``routes_frontend``), so the browser never sends such a request. Requests to other hosts are aborted here as well,
so the test never reaches the network, whatever the page tries.
"""

from __future__ import annotations

import time
from urllib.parse import urlsplit

import test_server_frontend_browser
from test_server_frontend_browser import APP_READY, CHROMIUM, TIMEOUT_MS, _jobs, _load, _start, sync_playwright

from lorabind.runtime.server import ServerConfig

pytestmark = test_server_frontend_browser.pytestmark  # the browser tests' marks: slow, skipped without chromium

LOOPBACK = ("127.0.0.1", "localhost", "[::1]", "::1")
SETTLE_S = 3.0  # after the Issues panel opens: its lookups start when it mounts


def _recorded(context) -> list:
    """Every URL the pages of ``context`` request (WebSockets too), the outside ones aborted before they leave."""
    seen = []

    def handle(route):
        url = route.request.url
        seen.append(url)
        if urlsplit(url).hostname in LOOPBACK or url.startswith(("data:", "blob:")):
            route.continue_()
        else:
            route.abort()

    context.route("**/*", handle)
    context.on("page", lambda page: page.on("websocket", lambda socket: seen.append(socket.url)))
    return seen


def test_open_run_a_refused_run_and_the_issues_panel_request_nothing_outside(tiny_models_root, tmp_path):
    server = _start(ServerConfig(port=0, models_root=str(tiny_models_root), output_dir=str(tmp_path / "output"),
                                 input_dir=str(tmp_path / "input"), temp_dir=str(tmp_path / "temp")))
    try:
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
            context = browser.new_context(viewport={"width": 1600, "height": 1000})
            seen = _recorded(context)
            page = context.new_page()
            page.goto(server.url + "/")  # open: the main example
            page.wait_for_function(APP_READY, timeout=TIMEOUT_MS)

            page.click('[data-testid="queue-button"]')  # Run
            deadline = time.monotonic() + TIMEOUT_MS / 1000
            while not _jobs(server, "completed,failed,cancelled") and time.monotonic() < deadline:
                time.sleep(0.5)
            assert [job["status"] for job in _jobs(server, "completed,failed,cancelled")] == ["completed"]

            _load(page, "wan22_mismatched_contract")  # a refused Run, then its Issues panel
            page.click('[data-testid="queue-button"]')
            page.wait_for_selector('[data-testid="error-overlay"]', timeout=TIMEOUT_MS)
            page.click('[data-testid="error-overlay-see-errors"]')
            page.wait_for_selector('[data-testid="error-group-execution"]', timeout=TIMEOUT_MS)
            page.wait_for_timeout(SETTLE_S * 1000)
            browser.close()
    finally:
        server.stop()
    assert any(url.startswith(server.url) for url in seen) and any(url.startswith("ws://") for url in seen)
    outside = sorted({url for url in seen if urlsplit(url).hostname not in LOOPBACK
                      and not url.startswith(("data:", "blob:"))})
    assert outside == [], outside
