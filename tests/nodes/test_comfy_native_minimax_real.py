"""ComfyUI-native MiniMax-H3 in real ComfyUI 0.30.0 (``shared/peers/real-comfyui.sh --comfy 0.30.0``), the first
version with its own MiniMax-H3 model (``comfy/ldm/minimax``): the tiny ComfyUI-detectable MiniMax-H3
(``tiny_models/comfyui_minimax.py``, what ``build-tiny --comfyui`` writes) with a Turbo LoRA through
``LoraBindLoRA``, ComfyUI's ``MiniMaxH3SigmaShift``, ``EmptyMiniMaxH3LatentAV`` and ``KSampler`` runs; the same
with 8 steps on the 4-step Turbo file, with the 544p shift on the 768p file, or with ``ModelSamplingSD3`` at 6 alone
(ComfyUI's DiT then derives the audio schedule as for shift 12), is refused in the sampler before any step, naming
the file and the field. For every MiniMax-H3 fixture LoRA (the Turbo names, the native FlashGen layout), the
weights ComfyUI's patcher writes equal our own fuse bit for bit (CPU, bfloat16), and every file tensor is
accounted for. ComfyUI 0.3.64 has no MiniMax-H3: the module is skipped there, saying so.

One ComfyUI start serves every prompt (``comfy_native_client.py`` through ``--exec``).
"""

import json
import os
from pathlib import Path
from types import SimpleNamespace

import pytest
from safetensors.torch import load_file

from real_comfyui import classes_from_object_info, require_harness, run_native_prompts, version_tuple

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
TINY_WORKFLOW = REPO / "tests" / "data" / "comfy_minimax_h3_turbo.tiny.api.json"
SHIPPED_WORKFLOW = REPO / "workflows" / "api" / "comfy_minimax_h3_turbo_4step_768p.api.json"
FIRST_WITH_MINIMAX = (0, 30, 0)  # MiniMax-H3 arrived in ComfyUI between the snapshots (comfy/ldm/minimax)
TURBO = "minimax_h3_fl2v_turbo_4step_v1.2_768p_bf16.safetensors"
NATIVE = "minimax_h3_t2va_flashgen_4step_v1.0_768p_bf16.safetensors"
STAND_INS = {"LoraBindTestMiniMaxConditioning", "LoraBindTestLatentStats"}


def _snapshot(harness: Path, version: str) -> None:
    """Skip, saying why, on a version without MiniMax-H3 (every real-ComfyUI module runs on each version)."""
    if version_tuple(version) < FIRST_WITH_MINIMAX:
        pytest.skip(f"ComfyUI {version} has no MiniMax-H3 model (no comfy/ldm/minimax, no MiniMaxH3 in its "
                    f"supported models): ComfyUI-native MiniMax-H3 needs ComfyUI 0.30.0 or later")
    if not list(harness.parent.glob(f"comfyui-{version}-*.tar.gz")):
        pytest.skip(f"no ComfyUI {version} snapshot beside {harness}")


def _variant(drop=(), **changes) -> dict:
    prompt = json.loads(TINY_WORKFLOW.read_text())
    for node_id, inputs in changes.items():
        if isinstance(inputs, tuple):  # (class_type, inputs): another node in that place
            prompt[node_id] = {"class_type": inputs[0], "inputs": inputs[1]}
        else:
            prompt[node_id]["inputs"].update(inputs)
    for node_id in drop:
        del prompt[node_id]
    return prompt


def _native_prompt() -> dict:
    """The native FlashGen file, its base_schedule as SIGMAS (LoraBindContractSigmas) for SamplerCustomAdvanced."""
    nodes = {
        "20": ("LoraBindContractSigmas", {"model": ["3", 0]}),
        "21": ("RandomNoise", {"noise_seed": 5}),
        "22": ("KSamplerSelect", {"sampler_name": "euler"}),
        "23": ("CFGGuider", {"model": ["3", 0], "positive": ["4", 0], "negative": ["5", 0], "cfg": 1.0}),
        "24": ("SamplerCustomAdvanced", {"noise": ["21", 0], "guider": ["23", 0], "sampler": ["22", 0],
                                         "sigmas": ["20", 0], "latent_image": ["6", 0]}),
        "8": ("LoraBindTestLatentStats", {"samples": ["24", 0]}),
    }
    prompt = _variant(drop=("7",), **{"2": {"lora_name": f"lorabind-tiny/{NATIVE}"},
                                      "3": {"shift_video": 12.0, "shift_audio": 3.0}})
    prompt.update({node_id: {"class_type": kind, "inputs": inputs} for node_id, (kind, inputs) in nodes.items()})
    return prompt


def _probe(label: str, lora: str) -> dict:
    from comfy_patcher_cases import PROBE
    from lorabind.tiny_models.comfyui_minimax import DENOISER

    inputs = {"node": "LoraBindLoRA", "denoiser": DENOISER, "lora_name": f"lorabind-tiny/{lora}", "strength": 0.75,
              "lenient": False, "config": "{}", "out_name": f"patched_{label}"}
    return {"1": {"class_type": PROBE, "inputs": inputs}}


def _fixtures() -> list:
    from lorabind.tiny_models.minimax_h3 import NATIVE_FIXTURE_NAME, TURBO_FIXTURES

    return [*sorted(TURBO_FIXTURES), NATIVE_FIXTURE_NAME]


@pytest.fixture(scope="module")
def comfy_results(tmp_path_factory, comfy_version):
    harness = require_harness()
    _snapshot(harness, comfy_version)
    from lorabind.loaders.models import compat
    from lorabind.tiny_models.comfyui_files import write_comfyui_files
    from lorabind.tiny_models.minimax_h3 import write_minimax_fixture_loras

    if compat.unmet_requirements("minimax_h3"):
        pytest.skip(f"the tiny MiniMax-H3 needs {compat.unmet_requirements('minimax_h3')}")
    work = tmp_path_factory.mktemp("comfy_minimax")
    models = work / "models"
    write_comfyui_files(models, with_vae=False)  # build-tiny --comfyui, without the Wan VAE these prompts skip
    write_minimax_fixture_loras(models)
    prompts = {
        "turbo": _variant(),
        "steps8": _variant(**{"7": {"steps": 8, "seed": 1}}),
        "shift12": _variant(**{"3": {"shift_video": 12.0}, "7": {"seed": 2}}),
        "sd3_only": _variant(**{"3": ("ModelSamplingSD3", {"model": ["2", 0], "shift": 6.0}), "7": {"seed": 3}}),
        "native": _native_prompt(),
        "shipped": json.loads(SHIPPED_WORKFLOW.read_text()),  # real file names: refused for those alone
        **{f"probe_{index}": _probe(str(index), lora) for index, lora in enumerate(_fixtures())},
    }
    results, output, log = run_native_prompts(comfy_version, work, models, prompts,
                                              "LoraBindLoRA,MiniMaxH3SigmaShift,EmptyMiniMaxH3LatentAV")
    return results, output, models, log


def test_the_tiny_turbo_workflow_runs_on_comfyui_own_minimax_nodes_and_sampler(comfy_results):
    run = comfy_results[0]["turbo"]
    assert run["status"] == "success", run["error"]
    text = " ".join(run["outputs"]["2"]["text"])
    assert "0 unmatched" in text and "contract enforced" in text and "flow_shift=6, audio_flow_shift=3" in text
    (stats,) = run["outputs"]["8"]["latent"]
    assert stats["shapes"] == [[1, 24, 2, 2, 2], [1, 32, 2, 8]] and stats["finite"]
    assert min(stats["abs_mean"]) > 0


@pytest.mark.parametrize("label, field", [
    ("steps8", "steps/sigmas: the sampler runs 8 steps"),
    ("shift12", "flow_shift: it needs flow_shift=6 (its name says _768p)"),
    ("sd3_only", "audio_flow_shift: it needs the soundtrack on audio_flow_shift=3"),
])
def test_a_run_off_the_turbo_contract_is_refused_before_any_step_naming_file_and_field(comfy_results, label,
                                                                                     field):
    run = comfy_results[0][label]
    assert run["status"] == "error"
    error = run["error"]
    assert error["node_id"] == "7" and error["exception_type"] == "ContractError"
    assert TURBO in error["exception_message"] and field in error["exception_message"]
    assert "8" not in error["executed"]


def test_a_native_flashgen_file_samples_its_base_schedule_through_contract_sigmas(comfy_results):
    run = comfy_results[0]["native"]
    assert run["status"] == "success", run["error"]
    assert "0 unmatched" in " ".join(run["outputs"]["2"]["text"])
    (stats,) = run["outputs"]["8"]["latent"]
    assert stats["finite"] and stats["shapes"][0] == [1, 24, 2, 2, 2]


def _our_fuse(lora_path: Path):
    """{native key: tensor} of the tiny ComfyUI MiniMax-H3's diffusers model after our own fuse (bfloat16)."""
    import torch

    from lorabind.loaders.binding.patching import PatchLayer, WeightPatcher
    from lorabind.loaders.families import guess_family
    from lorabind.loaders.families.minimax_h3 import FAMILY
    from lorabind.loaders.families.minimax_h3.key_layouts import MINIMAX_H3_TRANSFORMER as LAYOUT
    from lorabind.loaders.lora.preparation import prepare_lora
    from lorabind.tiny_models.comfyui_minimax import comfy_minimax_transformer

    module = comfy_minimax_transformer(torch.bfloat16)
    model = SimpleNamespace(name="tiny", family="minimax_h3", components={"transformer": module})
    prepared = prepare_lora(str(lora_path), model, "transformer", FAMILY, guess_family=guess_family)
    WeightPatcher({"transformer": module}).apply(
        [PatchLayer(lora_path.name, "transformer", 0.75, prepared.targets, lora_path.name)])
    state = module.state_dict()
    return {native: LAYOUT.join(native, [state[key] for key in held])
            for native, held in LAYOUT.native_plan(state).items()}


@pytest.mark.parametrize("index", range(9))
def test_comfyui_patcher_writes_our_fuse_bit_for_bit_for_every_minimax_fixture(comfy_results, index):
    from lorabind.tiny_models.comfyui_minimax import DENOISER

    results, output, models = comfy_results[:3]
    lora = _fixtures()[index]
    run = results[f"probe_{index}"]
    assert run["status"] == "success", run["error"]
    probe = run["outputs"]["1"]["probe"][0]
    assert probe["accounting"]["counts"]["unmatched"] == 0 and probe["remade"] == []
    theirs = load_file(str(output / f"patched_{index}.safetensors"))
    ours = _our_fuse(models / "loras" / "lorabind-tiny" / lora)
    original = load_file(str(models / "diffusion_models" / DENOISER))
    assert set(theirs) == set(ours) | {"rope.inv_freq"} == set(original)  # a buffer diffusers recomputes
    changed = sorted(key for key in ours if not ours[key].float().equal(original[key].float()))
    assert len(changed) == probe["ours_patched"] > 0
    unequal = [key for key in ours if not theirs[key].equal(ours[key].float())]
    assert unequal == [], (lora, unequal)


def test_the_shipped_example_differs_from_the_tiny_one_in_files_sizes_and_the_stand_ins():
    """The example a user opens (workflows/) is the tiny twin with ComfyUI's real text encoder, VAEs and decode
    in place of the stand-ins: every node the two share has the same class and the same LoRA and sampler inputs."""
    shipped, tiny = json.loads(SHIPPED_WORKFLOW.read_text()), json.loads(TINY_WORKFLOW.read_text())
    for node_id in ("2", "3", "7"):  # LoraBindLoRA, MiniMaxH3SigmaShift, KSampler
        assert shipped[node_id]["class_type"] == tiny[node_id]["class_type"]
        for name, value in tiny[node_id]["inputs"].items():
            if not isinstance(value, list) and name not in ("seed",):
                assert os.path.basename(str(shipped[node_id]["inputs"][name])) == os.path.basename(str(value)), name
    assert not STAND_INS & {node["class_type"] for node in shipped.values()}


def test_the_shipped_ui_form_converts_to_the_shipped_api_form_with_comfyui_0_30_definitions(comfy_results):
    """The UI workflow a user opens gives, through our frontend-compatible conversion with the node definitions of
    the ComfyUI that ran the tiny twin (its MiniMax-H3 nodes are v3 schema nodes), exactly the shipped API form."""
    from comfy_native_client import OBJECT_INFO
    from lorabind.runtime.workflow_format import to_api_prompt

    classes = classes_from_object_info(comfy_results[0][OBJECT_INFO])
    ui = REPO / "workflows" / SHIPPED_WORKFLOW.name.replace(".api.json", ".json")
    converted, kind = to_api_prompt(json.loads(ui.read_text()), classes)
    without_titles = {node_id: {"class_type": node["class_type"], "inputs": node["inputs"]}
                      for node_id, node in converted.items()}
    assert kind == "ui" and without_titles == json.loads(SHIPPED_WORKFLOW.read_text())


def test_comfyui_validates_the_shipped_example_but_for_its_model_files(comfy_results):
    """Queued as is, the shipped example is refused by ComfyUI's validation only because its model, encoder, VAE
    and LoRA files are not in the tiny models folder: every node and every other input value is valid there."""
    run = comfy_results[0]["shipped"]
    assert run["status"] == "rejected"
    errors = run["error"]["node_errors"]
    named = {(node_id, error["extra_info"]["input_name"]) for node_id, node in errors.items()
             for error in node["errors"]}
    assert named == {("1", "unet_name"), ("2", "lora_name"), ("4", "clip_name"), ("10", "vae_name"),
                     ("11", "vae_name")}
