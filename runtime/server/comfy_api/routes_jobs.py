"""``/jobs``: the queue and the history as one list of jobs, the way the ComfyUI frontend's queue panel reads them.

Since frontend 1.3x the queue/history panel no longer reads ``/queue`` and ``/history``: it asks
``GET /jobs?status=in_progress,pending`` and ``GET /jobs?status=completed,failed,cancelled`` and opens one job
with ``GET /jobs/{id}``. The job fields follow ComfyUI's ``comfy_execution/jobs.py``: ``create_time`` (ms,
stamped by ``POST /prompt``), execution start/end from the history's status messages, ``outputs_count`` and a
``preview_output`` (the first image/video/audio output, preferring files in ``output/``). Cancelling maps onto
what the queue already does: delete a pending job, interrupt a running one.
"""

from __future__ import annotations

from aiohttp import web

from ..composition_root import STATE_KEY, ServerState
from ..http_json import bad_request, dumps, read_json_body

STATUSES = ("pending", "in_progress", "completed", "failed", "cancelled")
MAX_LIMIT = 500  # the frontend asks for 200 at a time
PREVIEWABLE = ("images", "video", "audio")


def register(routes: web.RouteTableDef) -> None:
    routes.get("/jobs")(get_jobs)
    routes.get("/jobs/{job_id}")(get_job)
    routes.post("/jobs/{job_id}/cancel")(post_cancel_job)
    routes.post("/jobs/cancel")(post_cancel_jobs)


def _queued_job(item: list, status: str) -> dict:
    number, prompt_id, _, extra_data, _ = item
    return {"id": prompt_id, "status": status, "priority": number,
            "create_time": extra_data.get("create_time", 0), "outputs_count": 0, "previewable_outputs_count": 0,
            "workflow_id": _workflow_id(extra_data)}


def _workflow_id(extra_data: dict):
    workflow = (extra_data.get("extra_pnginfo") or {}).get("workflow")
    return workflow.get("id") if isinstance(workflow, dict) else None


def _outputs_summary(outputs: dict) -> tuple[int, int, dict | None]:
    """(outputs, previewable outputs, the preview): the first previewable item, one in ``output/`` first."""
    count = previewable = 0
    preview = fallback = None
    for node_id, node_outputs in outputs.items():
        if not isinstance(node_outputs, dict):
            continue
        for media_type, items in node_outputs.items():
            if media_type == "animated" or not isinstance(items, list):
                continue
            for item in items:
                if not isinstance(item, dict):
                    continue
                count += 1
                if media_type not in PREVIEWABLE:
                    continue
                previewable += 1
                enriched = {**item, "nodeId": node_id, "mediaType": media_type}
                if preview is None and item.get("type") == "output":
                    preview = enriched
                elif fallback is None:
                    fallback = enriched
    return count, previewable, preview or fallback


def _history_job(prompt_id: str, entry: dict, *, detail: bool = False) -> dict:
    number, _, prompt, extra_data, _ = entry["prompt"]
    status = entry.get("status") or {}
    start = end = error = None
    for message in status.get("messages", []):
        if isinstance(message, (list, tuple)) and len(message) >= 2 and isinstance(message[1], dict):
            name, data = message[0], message[1]
            if name == "execution_start":
                start = data.get("timestamp")
            elif name in ("execution_success", "execution_error", "execution_interrupted"):
                end = data.get("timestamp")
                error = data if name == "execution_error" else error
    interrupted = any(isinstance(m, (list, tuple)) and m and m[0] == "execution_interrupted"
                      for m in status.get("messages", []))
    failed = status.get("status_str") == "error"
    outputs = entry.get("outputs") or {}
    count, previewable, preview = _outputs_summary(outputs)
    job = {"id": prompt_id, "status": "cancelled" if failed and interrupted else "failed" if failed else "completed",
           "priority": number, "create_time": extra_data.get("create_time", 0), "execution_start_time": start,
           "execution_end_time": end, "execution_error": _naming_the_node(error), "outputs_count": count,
           "previewable_outputs_count": previewable, "preview_output": preview,
           "workflow_id": _workflow_id(extra_data)}
    if detail:
        job.update(outputs=outputs, execution_status=status, workflow={"prompt": prompt, "extra_data": extra_data})
    return job


def _naming_the_node(error: dict | None) -> dict | None:
    """The execution_error with its node in front of the message: the queue panel of frontend 1.58.1 shows a
    failed job's ``exception_message`` and nothing else of it (its row is a fixed "Failed / Failed"), so without
    this a failed job said what went wrong but not where (issue 30). The history keeps ComfyUI's payload."""
    if not error or error.get("node_id") is None:
        return error
    prefix = f"node {error['node_id']} ({error.get('node_type')}): "
    message = str(error.get("exception_message") or "")
    return error if message.startswith(prefix) else {**error, "exception_message": prefix + message}


def _all_jobs(state: ServerState, statuses: set[str]) -> list[dict]:
    running, pending = state.queue.snapshot()
    jobs = [_queued_job(item, "in_progress") for item in running] if "in_progress" in statuses else []
    if "pending" in statuses:
        jobs += [_queued_job(item, "pending") for item in pending]
    if statuses & {"completed", "failed", "cancelled"}:
        jobs += [job for prompt_id, entry in state.history.list().items()
                 if (job := _history_job(prompt_id, entry))["status"] in statuses]
    return jobs


def _int_query(request: web.Request, name: str, default: int) -> int:
    raw = request.query.get(name, "")
    try:
        value = int(raw) if raw else default
    except ValueError:
        raise bad_request("invalid_request", f"Query parameter '{name}' must be an integer, got {raw!r}.") from None
    if value < 0:
        raise bad_request("invalid_request", f"Query parameter '{name}' must not be negative, got {value}.")
    return value


async def get_jobs(request: web.Request) -> web.Response:
    """``?status=a,b&limit=&offset=&sort_order=desc&workflow_id=``: newest first, as ComfyUI sorts."""
    raw_statuses = request.query.get("status", "")
    statuses = {s for s in raw_statuses.split(",") if s} or set(STATUSES)
    unknown = sorted(statuses - set(STATUSES))
    if unknown:
        raise bad_request("invalid_request", f"Unknown job status {unknown[0]!r}; expected some of "
                          f"{', '.join(STATUSES)}.")
    limit = min(_int_query(request, "limit", MAX_LIMIT), MAX_LIMIT)
    offset = _int_query(request, "offset", 0)
    jobs = _all_jobs(request.app[STATE_KEY], statuses)
    workflow_id = request.query.get("workflow_id")
    if workflow_id:
        jobs = [job for job in jobs if job["workflow_id"] == workflow_id]
    # newest first by creation time; ties (and entries from before create_time existed) by queue order
    jobs.sort(key=lambda job: (job["create_time"], job["priority"]),
              reverse=request.query.get("sort_order", "desc") != "asc")
    page = jobs[offset:offset + limit]
    return web.json_response({"jobs": page, "pagination": {"offset": offset, "limit": limit, "total": len(jobs),
                                                           "has_more": offset + len(page) < len(jobs)}},
                             dumps=dumps)


async def get_job(request: web.Request) -> web.Response:
    state: ServerState = request.app[STATE_KEY]
    job_id = request.match_info["job_id"]
    entry = state.history.get(job_id).get(job_id)
    if entry is not None:
        return web.json_response(_history_job(job_id, entry, detail=True), dumps=dumps)
    for job in _all_jobs(state, {"in_progress", "pending"}):
        if job["id"] == job_id:
            return web.json_response(job, dumps=dumps)
    raise web.HTTPNotFound(text=f"no job {job_id!r}")


def _cancel(state: ServerState, job_ids: list[str]) -> None:
    state.queue.delete(job_ids)
    for job_id in job_ids:
        state.worker.interrupt(job_id)


async def post_cancel_job(request: web.Request) -> web.Response:
    _cancel(request.app[STATE_KEY], [request.match_info["job_id"]])
    return web.Response(status=200)


async def post_cancel_jobs(request: web.Request) -> web.Response:
    body = await read_json_body(request)
    job_ids = body.get("job_ids")
    if not isinstance(job_ids, list) or not all(isinstance(j, str) for j in job_ids):
        raise bad_request("invalid_request", "Field 'job_ids' must be a list of job ids.")
    _cancel(request.app[STATE_KEY], job_ids)
    return web.Response(status=200)
