"""A Hugging Face-compatible hub on loopback for the download tests: the endpoints huggingface_hub calls to get a
file (``POST /api/models/{repo}/paths-info/{revision}`` for sizes and LFS sha256, ``HEAD``/``GET
/{repo}/resolve/{revision}/{path}`` with ETag, X-Repo-Commit, Content-Length and Range), reached via
``HF_ENDPOINT``. No network: everything it serves is in memory.

Knobs a test turns: ``gated`` / ``missing`` repositories (401 GatedRepo / 404 RepoNotFound, as the hub answers),
``corrupt`` paths (one byte changed in what is served, the metadata keeps the true sha256), ``stall_after`` (the
GET sends that many bytes, then waits until ``release`` is set: a download to kill half-way). ``requests`` records
(method, path, Range header) of every request.
"""

from __future__ import annotations

import asyncio
import hashlib
import threading

from aiohttp import web

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def git_blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


class FakeHub:
    def __init__(self, files: dict):
        """``files``: {"owner/name": {"path/in/repo": bytes}}."""
        self.files = files
        self.gated: set = set()
        self.missing: set = set()
        self.corrupt: set = set()  # (repo, path)
        self.stall_after: dict = {}  # (repo, path) -> bytes sent before waiting for ``release``
        self.release = threading.Event()
        self.requests: list = []
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        app = web.Application()
        app.router.add_post("/api/models/{owner}/{name}/paths-info/{revision}", self._paths_info)
        app.router.add_route("*", "/{owner}/{name}/resolve/{revision}/{path:.+}", self._resolve)
        self._runner = web.AppRunner(app, access_log=None)
        self._thread = threading.Thread(target=self._serve, name="fake-hub", daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> "FakeHub":
        self._thread.start()
        assert self._ready.wait(30), "the fake hub did not start"
        return self

    def stop(self) -> None:
        self.release.set()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(30)

    def __enter__(self) -> "FakeHub":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def gets(self, path: str) -> list:
        """The Range headers of every GET of ``path`` (None for a GET of the whole file)."""
        return [rng for method, requested, rng in self.requests if method == "GET" and requested.endswith(path)]

    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_until_complete(self._runner.setup())
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        self._loop.run_until_complete(site.start())
        self.port = self._runner.addresses[0][1]
        self._ready.set()
        self._loop.run_forever()
        self._loop.run_until_complete(self._runner.cleanup())

    def _refusal(self, repo: str):
        if repo in self.gated:
            return web.Response(status=401, headers={"X-Error-Code": "GatedRepo",
                                                     "X-Error-Message": "Access to model is restricted"})
        if repo in self.missing or repo not in self.files:
            return web.Response(status=404, headers={"X-Error-Code": "RepoNotFound",
                                                     "X-Error-Message": "Repository not found"})
        return None

    async def _paths_info(self, request: web.Request):
        repo = f"{request.match_info['owner']}/{request.match_info['name']}"
        self.requests.append(("POST", request.path, None))
        refused = self._refusal(repo)
        if refused is not None:
            return refused
        form = await request.post()
        entries = []
        for path in form.getall("paths", []):
            data = self.files[repo].get(path)
            if data is None:
                continue
            entries.append({"type": "file", "path": path, "size": len(data), "oid": git_blob_id(data),
                            "lfs": {"oid": hashlib.sha256(data).hexdigest(), "size": len(data), "pointerSize": 134}})
        return web.json_response(entries)

    async def _resolve(self, request: web.Request):
        repo = f"{request.match_info['owner']}/{request.match_info['name']}"
        path = request.match_info["path"]
        self.requests.append((request.method, request.path, request.headers.get("Range")))
        refused = self._refusal(repo)
        if refused is not None:
            return refused
        data = self.files[repo].get(path)
        if data is None:
            return web.Response(status=404, headers={"X-Error-Code": "EntryNotFound"})
        sha = hashlib.sha256(data).hexdigest()
        if (repo, path) in self.corrupt:
            data = data[:len(data) // 2] + bytes([data[len(data) // 2] ^ 0xFF]) + data[len(data) // 2 + 1:]
        start = _range_start(request.headers.get("Range"))
        headers = {"ETag": f'"{sha}"', "X-Repo-Commit": COMMIT, "X-Linked-Size": str(len(data)),
                   "X-Linked-Etag": f'"{sha}"', "Accept-Ranges": "bytes"}
        status = 206 if start else 200
        if start:
            headers["Content-Range"] = f"bytes {start}-{len(data) - 1}/{len(data)}"
        body = data[start:]
        headers["Content-Length"] = str(len(body))
        if request.method == "HEAD":
            return web.Response(status=status, headers=headers)
        response = web.StreamResponse(status=status, headers=headers)
        await response.prepare(request)
        stall = self.stall_after.get((repo, path))
        if stall is not None and start < stall:
            await response.write(body[:stall - start])
            await asyncio.get_running_loop().run_in_executor(None, self.release.wait, 120)
            return response  # the client was killed meanwhile
        await response.write(body)
        await response.write_eof()
        return response


def _range_start(header) -> int:
    if not header or not header.startswith("bytes="):
        return 0
    return int(header[len("bytes="):].split("-", 1)[0] or 0)
