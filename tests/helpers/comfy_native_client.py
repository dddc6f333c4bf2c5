"""Queue several API prompts on a running ComfyUI and record how each ended (run by ``real-comfyui.sh --exec``).

``python comfy_native_client.py URL PROMPTS.json RESULTS.json``: PROMPTS maps a label to an API prompt; RESULTS
maps the label to ``{"status": "success" | "error", "error": <execution_error payload or None>, "outputs":
{node id: ui output}, "progress_events": how many step-progress messages it sent}``, and under ``OBJECT_INFO``
ComfyUI's ``/object_info`` (the node definitions a UI workflow is converted with). Prompts run one after another, each followed on the WebSocket until ComfyUI says done.
"""

import asyncio
import json
import sys
import uuid

import aiohttp

OBJECT_INFO = "_object_info"


async def _run_one(session, url: str, prompt: dict) -> dict:
    client_id = uuid.uuid4().hex
    async with session.ws_connect(f"{url}/ws?clientId={client_id}", max_msg_size=0) as socket:
        async with session.post(f"{url}/prompt", json={"prompt": prompt, "client_id": client_id}) as reply:
            body = await reply.json()
        if reply.status != 200:
            return {"status": "rejected", "error": body, "outputs": {}}
        prompt_id, error, steps = body["prompt_id"], None, 0
        while True:
            message = await socket.receive(timeout=600)
            if message.type != aiohttp.WSMsgType.TEXT:
                continue
            event = json.loads(message.data)
            data = event.get("data") or {}
            if data.get("prompt_id") not in (None, prompt_id):
                continue
            if event["type"] == "execution_error":
                error = data
            steps += event["type"] == "progress"  # a sampler step (ComfyUI's ProgressBar), of any node
            if event["type"] in ("execution_error", "execution_success") or (
                    event["type"] == "executing" and data.get("node") is None):
                break
    entry = await _history_entry(session, url, prompt_id)
    return {"status": "error" if error else "success", "error": error, "outputs": entry.get("outputs", {}),
            "progress_events": steps}


async def _history_entry(session, url: str, prompt_id: str) -> dict:
    """The prompt's history entry. ComfyUI sends ``execution_success`` before it files the history (a fast prompt's
    entry can be missing right after the event), so ask again for a while."""
    for _ in range(100):
        async with session.get(f"{url}/history/{prompt_id}") as reply:
            entry = (await reply.json()).get(prompt_id)
        if entry is not None:
            return entry
        await asyncio.sleep(0.1)
    return {}


async def main(url: str, prompts_path: str, results_path: str) -> None:
    prompts = json.load(open(prompts_path))
    results = {}
    async with aiohttp.ClientSession() as session:
        for label, prompt in prompts.items():
            results[label] = await _run_one(session, url, prompt)
            print(label, results[label]["status"])
        async with session.get(f"{url}/object_info") as reply:
            results[OBJECT_INFO] = await reply.json()
    json.dump(results, open(results_path, "w"), indent=1)


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:4]))
