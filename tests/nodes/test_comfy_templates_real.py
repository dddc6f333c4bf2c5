"""Issue 57.2: a new user's first hour with the templates, in a fresh real ComfyUI (0.3.64 and 0.30.0) with the pack
installed and no tiny model, fixture LoRA or input image built (an empty models folder).

Before, ComfyUI listed 48 templates (the 24 ``.api.json`` twins too), and a template opened and queued failed
validation: the fixture LoRAs it names (``lorabind-tiny/...``) were neither listed nor built inside ComfyUI. Now
the test opens ComfyUI's own template list (``/workflow_templates``), fetches each template as the frontend does,
converts it with ComfyUI's node definitions as the frontend would, and queues it: each lorabind template builds
what it names on that first queue (through the pack's on-prompt handler) and runs; the one that fails on purpose
fails with its contract message; a ComfyUI-native example that needs real weights is refused for exactly the
files it offers to download (``properties.models``), and MiniMax-H3's only where ComfyUI has no MiniMax-H3
(0.3.64) or for its placeholder file names.
"""

from pathlib import Path

import pytest

from real_comfyui import RealComfyUI, classes_from_object_info, version_tuple

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
TEMPLATES = sorted(p.stem for p in (REPO / "workflows").glob("*.json"))
FAILS_ON_PURPOSE = {"wan22_mismatched_contract": "is a 4-step distill LoRA: steps must be 4, got 20"}
MINIMAX_NATIVE = "comfy_minimax_h3_turbo_4step_768p"


@pytest.fixture(scope="module")
def first_queues(tmp_path_factory, comfy_version):
    """Every template ComfyUI lists, opened and queued once in a fresh ComfyUI on an empty models folder."""
    from lorabind.runtime.workflow_format import to_api_prompt

    work = tmp_path_factory.mktemp("comfy_templates")
    models = work / "models"
    models.mkdir()
    with RealComfyUI(work, models, version=comfy_version) as comfy:
        status, listed = comfy.get("/workflow_templates")
        assert status == 200
        classes = classes_from_object_info(comfy.get("/object_info")[1])
        runs = {}
        for name in listed.get("lorabind", []):
            status, workflow = comfy.get(f"/api/workflow_templates/lorabind/{name}.json")
            assert status == 200, name
            try:
                prompt, _ = to_api_prompt(workflow, classes)
            except Exception as unconvertible:  # a node type this ComfyUI does not have
                runs[name] = {"unconvertible": str(unconvertible), "workflow": workflow}
                continue
            run = comfy.run(prompt, timeout=900, extra_data={"extra_pnginfo": {"workflow": workflow}})
            runs[name] = {"run": run, "workflow": workflow}
        log = (comfy.base / "comfyui.log").read_text(errors="replace")
        yield listed, runs, models, log, comfy_version


def test_comfyui_lists_exactly_the_ui_templates(first_queues):
    listed = first_queues[0]
    assert sorted(listed) == ["lorabind"] and sorted(listed["lorabind"]) == TEMPLATES


@pytest.mark.parametrize("name", [name for name in TEMPLATES if not name.startswith("comfy_")])
def test_each_lorabind_template_builds_what_it_names_on_its_first_queue_and_runs(first_queues, name):
    run = first_queues[1][name]["run"]
    assert run.status == 200, run.body  # validated: what it names was built before ComfyUI validated it
    if name in FAILS_ON_PURPOSE:
        assert run.error is not None and FAILS_ON_PURPOSE[name] in run.error["exception_message"]
        return
    assert run.error is None, run.error
    saved = [item for output in run.history.get("outputs", {}).values() for kind in ("images", "gifs", "audio")
             for item in output.get(kind, ())]
    assert saved, run.history


def test_the_first_queue_built_into_the_empty_models_folder_and_said_so(first_queues):
    models, log = first_queues[2], first_queues[3]
    assert (models / "loras" / "lorabind-tiny").is_dir() and (models / "diffusers" / "tiny-wan22-t2v").is_dir()
    assert "[lorabind] building the built-in tiny model" in log


def _refused_files(run) -> set:
    """(input name, value) of every file ComfyUI's validation refused as not in its list."""
    assert run.status == 400, run.body
    return {(error["extra_info"]["input_name"], error["extra_info"]["received_value"])
            for node in run.body["node_errors"].values() for error in node["errors"]
            if error["type"] == "value_not_in_list"}


@pytest.mark.parametrize("name", [name for name in TEMPLATES if name.startswith("comfy_") and name != MINIMAX_NATIVE])
def test_a_comfyui_native_template_is_refused_only_for_the_real_files_it_offers_to_download(first_queues, name):
    entry = first_queues[1][name]
    offered = {model["name"] for node in entry["workflow"]["nodes"]
               for model in node.get("properties", {}).get("models", [])}
    refused = _refused_files(entry["run"])
    assert {value for _, value in refused} == offered and offered
    kinds = {error["type"] for node in entry["run"].body["node_errors"].values() for error in node["errors"]}
    assert kinds == {"value_not_in_list"}  # nothing else is wrong with it


def test_the_minimax_template_needs_comfyui_0_30_and_real_files(first_queues):
    entry, version = first_queues[1][MINIMAX_NATIVE], first_queues[4]
    if version_tuple(version) < version_tuple("0.30.0"):
        assert "MiniMaxH3" in entry.get("unconvertible", "") or entry["run"].status == 400
        return
    refused = _refused_files(entry["run"])
    assert {input_name for input_name, _ in refused} <= {"unet_name", "clip_name", "vae_name", "lora_name"}
    assert refused
