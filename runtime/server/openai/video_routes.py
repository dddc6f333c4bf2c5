"""OpenAI's video job API: ``POST /v1/videos`` queues a job, ``GET /v1/videos/{id}`` reports its status and
progress, ``GET /v1/videos/{id}/content`` returns the file.

A job is a queued prompt: its id is the prompt id (so ``/history/{id}``, ``/interrupt`` and the WebSocket
events work with it too), its status comes from the queue (queued / in_progress, with the sampler's step
progress) and then from the history (completed / failed). What the job object reports of the request (model,
prompt, size, seconds) is kept in the prompt's ``extra_data``, so it survives a restart with the history.
"""

from __future__ import annotations

import base64
from typing import Optional

from aiohttp import web

from .errors import OpenAIRequestError, error_response
from .jobs import OPENAI_EXTRA_KEY, describe_request, queue_prompt, template_value
from .requests import parse_video
from .results import failure, result_files
from .service import read_body, service_of
from .templates import fill_in

VIDEO_ENDPOINT = "videos"


def register(app: web.Application) -> None:
    app.router.add_route("POST", "/v1/videos", create_video)
    app.router.add_route("GET", "/v1/videos/{video_id}", retrieve_video)
    app.router.add_route("GET", "/v1/videos/{video_id}/content", video_content)


async def create_video(request: web.Request) -> web.Response:
    service, state = service_of(request)
    try:
        generation = parse_video(await read_body(request), service.models)
        template = generation.template
        prompt = fill_in(template, generation.values, generation.adapters)
        description = {**describe_request(VIDEO_ENDPOINT, template, generation.values, generation.sent),
                       "seconds": _seconds(template, generation.values)}
        prompt_id, _ = await queue_prompt(state, service.watcher, template, prompt, description,
                                          generation.client_id)
    except OpenAIRequestError as exc:
        return exc.response()
    return web.json_response(_video_object(prompt_id, description, "queued", 0))


async def retrieve_video(request: web.Request) -> web.Response:
    found = _job(request)
    if isinstance(found, web.Response):
        return found
    return web.json_response(found)


async def video_content(request: web.Request) -> web.Response:
    """The finished file (an animated WebP, or LoraBindSaveVideo's MP4 / WebM; its content type says so)."""
    variant = request.query.get("variant", "video")
    if variant != "video":
        return error_response(f"variant: only 'video' is available, not {variant!r}", param="variant")
    found = _job(request)
    if isinstance(found, web.Response):
        return found
    if found["status"] != "completed":
        return error_response(f"video {found['id']} is {found['status']}, not completed", code="video_not_ready")
    _, state = service_of(request)
    files = result_files(state.history.get(found["id"])[found["id"]], state.config)
    if not files:
        return error_response(f"video {found['id']} saved no file", status=404, code="not_found")
    return web.FileResponse(files[0].path, headers={"Content-Type": files[0].mime})


def _job(request: web.Request):
    """The job object for ``video_id``, or a 404 response. While it runs it carries the running sampler's step of
    its steps and, with ``?preview=true``, that step's latest live preview (when the server previews steps)."""
    service, state = service_of(request)
    video_id = request.match_info["video_id"]
    running, pending = state.queue.snapshot()
    for status, items in (("in_progress", running), ("queued", pending)):
        for item in items:
            description = _description(item[3])
            if item[1] == video_id and description is not None:
                if status == "queued":
                    return _video_object(video_id, description, status, 0)
                return _running(service.watcher, video_id, description, request.query.get("preview") == "true")
    entry = state.history.get(video_id).get(video_id)
    description = _description(entry["prompt"][3]) if entry else None
    if description is None:
        return error_response(f"no video job {video_id!r}", status=404, code="not_found")
    if (entry.get("status") or {}).get("status_str") == "success":
        return _video_object(video_id, description, "completed", 100, completed_at=_finished_at(entry))
    model = description.get("model")  # the extra_data of a /prompt may pose as a job: any JSON may be here
    template = service.models.get(model) if isinstance(model, str) else None
    error = (failure(template, entry, description.get("fields")) if template is not None
             else OpenAIRequestError("the job failed"))
    return _video_object(video_id, description, "failed", 0, completed_at=_finished_at(entry),
                         error={"code": error.code or "failed", "message": error.message, "param": error.param})


def _running(watcher, video_id: str, description: dict, with_preview: bool) -> dict:
    """A running job: OpenAI's ``progress`` (percent), the sampler's ``step`` of ``num_inference_steps``
    (vllm-omni's name for the step count), and on request the latest ``preview`` as vllm-omni's ``b64_json`` with
    its ``media_type`` (null before the first)."""
    step, steps = watcher.progress(video_id)
    job = {**_video_object(video_id, description, "in_progress", min(99, 100 * step // steps) if steps else 0),
           "step": step, "num_inference_steps": steps}
    if with_preview:
        latest = watcher.preview(video_id)
        job["preview"] = None if latest is None else {"b64_json": base64.b64encode(latest[0]).decode("ascii"),
                                                      "step": latest[1], "media_type": latest[2]}
    return job


def _description(extra_data) -> Optional[dict]:
    description = (extra_data or {}).get(OPENAI_EXTRA_KEY) if isinstance(extra_data, dict) else None
    return description if isinstance(description, dict) and description.get("endpoint") == VIDEO_ENDPOINT else None


def _finished_at(entry: dict) -> Optional[int]:
    stamps = [data.get("timestamp") for _, data in (entry.get("status") or {}).get("messages", [])
              if isinstance(data, dict) and isinstance(data.get("timestamp"), (int, float))]
    return int(max(stamps) / 1000) if stamps else None


def _seconds(template, values: dict) -> Optional[str]:
    frames = values.get("num_frames", template_value(template, "num_frames"))
    fps = values.get("fps", template_value(template, "fps"))
    return f"{frames / fps:g}" if isinstance(frames, int) and isinstance(fps, (int, float)) and fps > 0 else None


def _video_object(video_id: str, description: dict, status: str, progress: int, *,
                  completed_at: Optional[int] = None, error: Optional[dict] = None) -> dict:
    return {"id": video_id, "object": "video", "created_at": description.get("created_at"), "status": status,
            "model": description.get("model"), "progress": progress, "prompt": description.get("prompt"),
            "seconds": description.get("seconds"), "size": description.get("size"), "completed_at": completed_at,
            "expires_at": None, "error": error, "remixed_from_video_id": None}
