"""End to end through the real nodes: the tiny Wan2.2 example workflow, the same with the lightx2v-style LoRA
pair (contract + key accounting in the ``executed`` payloads the web extension reads), a contract violation,
and model / LoRA names that try to leave the models root."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

import lorabind
from engine_probes import load_count
from lorabind.runtime.server import ServerConfig
from lorabind.runtime.server.in_process_server import BackgroundServer
from server_client import Client, run_async

pytestmark = pytest.mark.slow  # runs whole workflows / servers end to end

# A committed file: a missing one fails the tests that read it, it is never a reason to skip.
WORKFLOW = Path(lorabind.__file__).parent / "workflows" / "api" / "wan22_tiny_t2v.api.json"


@pytest.fixture(scope="module")
def wan_server(tmp_path_factory):
    from lorabind.tiny_models import build_tiny, lora_fixtures

    root = tmp_path_factory.mktemp("wan22")
    build_tiny(root / "models", names=["tiny-wan22-t2v"])
    lora_fixtures.write_fixture_loras(root / "models")
    config = ServerConfig(port=0, models_root=str(root / "models"), output_dir=str(root / "output"),
                          input_dir=str(root / "input"), temp_dir=str(root / "temp"))
    srv = BackgroundServer(config).start()
    yield srv
    srv.stop()


def _example() -> dict:
    return json.loads(WORKFLOW.read_text(encoding="utf-8"))


def _with_pair(steps: int) -> dict:
    from lorabind.tiny_models.lora_fixtures import WAN22_HIGH, WAN22_LOW

    prompt = _example()
    sampler = next(k for k, n in prompt.items() if n["class_type"] == "LoraBindSampler")
    prompt["100"] = {"class_type": "WanMoELoRAPair",
                     "inputs": {"model": copy.deepcopy(prompt[sampler]["inputs"]["model"]),
                                "high_noise_lora": WAN22_HIGH, "high_noise_strength": 1.0,
                                "low_noise_lora": WAN22_LOW, "low_noise_strength": 1.0}}
    prompt[sampler]["inputs"].update(model=["100", 0], steps=steps, cfg=1.0)
    return prompt


def test_example_workflow_and_lora_pair_over_http(wan_server):
    async def body():
        client = Client(wan_server.url)
        try:
            await client.connect()
            pid = (await client.queue_prompt(_example()))["prompt_id"]
            seen = await client.wait_done(pid, timeout=300)
            assert [m["type"] for m in seen][0] == "execution_start"
            assert seen[-2]["type"] == "execution_success" and seen[-1]["data"]["node"] is None
            _, history = await client.get(f"/history/{pid}")
            images = [img for out in history[pid]["outputs"].values() for img in out.get("images", [])]
            assert len(images) == 1
            status, data = await client.get("/view", params=images[0])
            assert status == 200 and len(data) > 100

            pid = (await client.queue_prompt(_with_pair(steps=4)))["prompt_id"]
            seen = await client.wait_done(pid, timeout=300)
            executed = {m["data"]["node"]: m["data"]["output"] for m in seen if m["type"] == "executed"}
            pair = executed["100"]
            assert [a["component"] for a in pair["lorabind_accounting"]] == ["transformer", "transformer_2"]
            assert all(a["counts"]["applied"] > 0 and a["counts"]["unmatched"] == 0
                       for a in pair["lorabind_accounting"])
            assert [c["steps"] for c in pair["lorabind_contract"]] == [4, 4]
            schedule = next(out["lorabind_schedule"][0] for out in executed.values() if "lorabind_schedule" in out)
            assert schedule["steps"] == 4 and len(schedule["sigmas"]) == 5 and schedule["contracts"]
            # on the socket, "progress" is the 4 sampling steps only; fusing the pair is progress_state work
            assert [(m["data"]["value"], m["data"]["max"]) for m in seen if m["type"] == "progress"] == [
                (1, 4), (2, 4), (3, 4), (4, 4)]
            work = [m["data"] for m in seen if m["type"] == "progress_state"]
            assert work and all(w["prompt_id"] == pid for w in work)
            (entry,) = work[-1]["nodes"].values()
            assert entry["label"] == "binding LoRA layers" and entry["value"] == entry["max"] > 4
        finally:
            await client.close()

    run_async(body)


def test_contract_violation_is_an_execution_error_naming_the_file(wan_server):
    """A cfg the pair's contract refuses is decided by the sampler when it runs (the early check reads steps)."""
    from lorabind.tiny_models.lora_fixtures import WAN22_HIGH

    async def body():
        client = Client(wan_server.url)
        try:
            await client.connect()
            prompt = _with_pair(steps=4)
            sampler = next(k for k, n in prompt.items() if n["class_type"] == "LoraBindSampler")
            prompt[sampler]["inputs"]["cfg"] = 3.5
            pid = (await client.queue_prompt(prompt))["prompt_id"]
            seen = await client.wait_done(pid, timeout=300)
            errors = [m["data"] for m in seen if m["type"] == "execution_error"]
            assert len(errors) == 1 and errors[0]["node_type"] == "LoraBindSampler"
            assert Path(WAN22_HIGH).name in errors[0]["exception_message"]
            assert "cfg" in errors[0]["exception_message"] and "3.5" in errors[0]["exception_message"]
        finally:
            await client.close()

    run_async(body)


def test_a_mismatched_step_count_is_refused_at_validation_naming_the_file_and_field(wan_server):
    """As ``lorabind run`` does: the example whose sampler asks 20 steps of a 4-step pair is a 400 before it is
    queued (nothing loaded, nothing queued), with node_errors on the sampler naming the file and ``steps``."""
    prompt = json.loads((WORKFLOW.parent / "wan22_mismatched_contract.api.json").read_text(encoding="utf-8"))
    high_noise_file = Path(prompt["5"]["inputs"]["high_noise_lora"]).name

    async def body():
        client = Client(wan_server.url)
        try:
            status, reply = await client.post("/prompt", {"prompt": prompt})
            assert status == 400, reply
            assert reply["error"]["type"] == "prompt_outputs_failed_validation"
            (error,) = reply["node_errors"]["6"]["errors"]
            assert reply["node_errors"]["6"]["class_type"] == "LoraBindSampler"
            assert reply["node_errors"]["6"]["dependent_outputs"] == ["8"]
            assert error["extra_info"] == {"input_name": "steps", "received_value": 20,
                                           "lorabind_refusal": "contract_mismatch"}
            assert high_noise_file in error["details"] and "steps must be 4, got 20" in error["details"]
            assert (await client.get("/queue"))[1]["queue_pending"] == []
            prompt["6"]["inputs"]["steps"] = 4  # the same prompt at the contract's steps is queued and runs
            await client.connect()
            pid = (await client.queue_prompt(prompt))["prompt_id"]
            seen = await client.wait_done(pid, timeout=300)
            assert seen[-2]["type"] == "execution_success"
        finally:
            await client.close()

    run_async(body)


def test_model_and_lora_names_outside_the_models_root_are_refused(wan_server):
    async def body():
        client = Client(wan_server.url)
        try:
            bad_model = _example()
            loader = next(k for k, n in bad_model.items() if n["class_type"] == "LoraBindModelLoader")
            bad_model[loader]["inputs"]["model_name"] = "../../../etc"
            status, reply = await client.post("/prompt", {"prompt": bad_model})
            assert status == 400
            errors = reply["node_errors"][loader]["errors"]
            assert errors[0]["type"] == "value_not_in_list" and "../../../etc" in errors[0]["details"]

            bad_lora = _with_pair(steps=4)
            bad_lora["100"]["inputs"]["high_noise_lora"] = "/etc/passwd"
            status, reply = await client.post("/prompt", {"prompt": bad_lora})
            assert status == 400
            assert reply["node_errors"]["100"]["errors"][0]["extra_info"]["input_name"] == "high_noise_lora"
            assert (await client.get("/queue"))[1]["queue_pending"] == []
        finally:
            await client.close()

    run_async(body)


def test_a_missing_published_lora_fails_validation_with_the_choices_and_writes_nothing(wan_server):
    """The published lightx2v names outside ``lorabind-tiny/`` are the user's downloads: a missing one is the
    normal "not in list" validation error naming the file and the choices, never a random stand-in."""
    from lorabind.tiny_models.lora_fixtures import WAN22_HIGH, WAN22_LOW

    loras = Path(wan_server.config.models_root) / "loras"
    before = sorted(str(p.relative_to(loras)) for p in loras.rglob("*"))
    prompt = _with_pair(steps=4)
    published = {name: name.split("/", 1)[1] for name in (WAN22_HIGH, WAN22_LOW)}
    prompt["100"]["inputs"].update(high_noise_lora=published[WAN22_HIGH], low_noise_lora=published[WAN22_LOW])

    async def body():
        client = Client(wan_server.url)
        try:
            return await client.post("/prompt", {"prompt": prompt})
        finally:
            await client.close()

    status, reply = run_async(body)
    assert status == 400 and reply["error"]["type"] == "prompt_outputs_failed_validation"
    errors = {e["extra_info"]["input_name"]: e for e in reply["node_errors"]["100"]["errors"]}
    assert set(errors) == {"high_noise_lora", "low_noise_lora"}
    high = errors["high_noise_lora"]
    assert high["type"] == "value_not_in_list" and published[WAN22_HIGH] in high["details"]
    assert WAN22_HIGH in high["details"] and WAN22_LOW in high["details"]  # the choices, the fixtures among them
    assert sorted(str(p.relative_to(loras)) for p in loras.rglob("*")) == before


def test_free_unload_models_reloads_the_model_on_the_next_prompt(wan_server):

    model_dir = f"{wan_server.config.models_root}/diffusers/tiny-wan22-t2v"

    async def run_example(client, seed):
        prompt = _example()
        sampler = next(k for k, n in prompt.items() if n["class_type"] == "LoraBindSampler")
        prompt[sampler]["inputs"]["seed"] = seed
        pid = (await client.queue_prompt(prompt))["prompt_id"]
        assert "execution_success" in [m["type"] for m in await client.wait_done(pid, timeout=300)]

    async def body():
        client = Client(wan_server.url)
        try:
            await client.connect()
            await run_example(client, 1)
            loads = load_count(model_dir)
            assert (await client.post("/free", {"unload_models": True}))[0] == 200
            await run_example(client, 2)
            assert load_count(model_dir) == loads + 1
        finally:
            await client.close()

    run_async(body)


def test_pack_nodes_report_the_custom_nodes_module_like_comfyui(wan_server):
    """Inside ComfyUI the pack's nodes get python_module "custom_nodes.<folder>"; the frontend uses it to tell
    them from core nodes, so ``lorabind serve`` reports the same."""
    from lorabind.nodes import NODE_CLASS_MAPPINGS, NODE_DISPLAY_NAME_MAPPINGS
    from lorabind.runtime.core_nodes import CORE_NODE_CLASS_MAPPINGS

    async def body():
        client = Client(wan_server.url)
        try:
            _, info = await client.get("/object_info")
            assert sorted(info) == sorted([*NODE_CLASS_MAPPINGS, *CORE_NODE_CLASS_MAPPINGS])
            assert {info[name]["python_module"] for name in NODE_CLASS_MAPPINGS} == {"custom_nodes.lorabind"}
            # ComfyUI's own LoadImage/SaveImage/PreviewImage, which the runtime adds, report ComfyUI's module
            assert {info[name]["python_module"] for name in CORE_NODE_CLASS_MAPPINGS} == {"nodes"}
            _, one = await client.get("/object_info/LoraBindSampler")
            assert one["LoraBindSampler"]["python_module"] == "custom_nodes.lorabind"
            assert one["LoraBindSampler"]["display_name"] == NODE_DISPLAY_NAME_MAPPINGS["LoraBindSampler"]
        finally:
            await client.close()

    run_async(body)
