"""Turbo / native / checkpoint-pinned contracts: the published name matrix, refusals and sigma tables."""

from __future__ import annotations

import pytest

from lorabind.loaders.errors import ContractError
from lorabind.loaders.families.minimax_h3 import contracts as mm

# (name, metadata) -> (steps, video shift, tasks, alpha): the published table (reference §1.8.7)
TURBO_MATRIX = [
    ("minimax_h3_fl2v_turbo_4step_v0.1.safetensors", {}, 4, 12.0, ("t2va", "fl2va"), 8.0),
    ("minimax_h3_fl2v_turbo_4step_v1.0_768p_bf16.safetensors",
     {"key_format": "minimax-h3-diffusers", "alpha": "128"}, 4, 6.0, ("t2va", "fl2va"), 128.0),
    ("minimax_h3_fl2v_turbo_4step_v1.1_768p_bf16.safetensors",
     {"key_format": "minimax-h3-diffusers", "alpha": "128"}, 4, 6.0, ("t2va", "fl2va"), 128.0),
    ("minimax_h3_fl2v_turbo_4step_v1.2_768p_bf16.safetensors",
     {"key_format": "minimax-h3-diffusers", "alpha": "8"}, 4, 6.0, ("t2va", "fl2va"), 8.0),
    ("minimax_h3_fl2v_turbo_8step_v1.0_bf16.safetensors", {"alpha": "8"}, 8, 12.0, ("t2va", "fl2va"), 8.0),
    ("minimax_h3_fl2v_turbo_8step_v1.0_768p_bf16.safetensors",
     {"key_format": "minimax-h3-diffusers", "alpha": "8"}, 8, 6.0, ("t2va", "fl2va"), 8.0),
    ("minimax_h3_ref2v_turbo_4step_v0.1_bf16.safetensors", {}, 4, 12.0, ("ref2va",), 8.0),
    ("minimax_h3_ref2v_turbo_8step_v1.0_768p_bf16.safetensors",
     {"key_format": "minimax-h3-diffusers", "alpha": "128"}, 8, 6.0, ("ref2va",), 128.0),
]

# Published sigma tables (reference §5.2), N+1 points for N denoiser evaluations.
PUBLISHED_SIGMAS = {
    (4, 6.0): [1.0, 0.947368, 0.857143, 0.666667, 0.0],
    (4, 12.0): [1.0, 0.972973, 0.923077, 0.8, 0.0],
    (4, 3.0): [1.0, 0.9, 0.75, 0.5, 0.0],
    (8, 6.0): [1.0, 0.976744, 0.947368, 0.909091, 0.857143, 0.782609, 0.666667, 0.461538, 0.0],
    (8, 12.0): [1.0, 0.988235, 0.972973, 0.952381, 0.923077, 0.878049, 0.8, 0.631579, 0.0],
    (8, 3.0): [1.0, 0.954545, 0.9, 0.833333, 0.75, 0.642857, 0.5, 0.3, 0.0],
}
PINNED_VIDEO_12 = [1.0, 0.965517, 0.888889, 0.679245, 0.0]
PINNED_AUDIO_3 = [1.0, 0.875, 0.666667, 0.346154, 0.0]
PINNED_INDEX = {"_minimax_h3": {"partition": "fl2va", "tasks": ["t2va", "fl2va"],
                                "sigma_shift_scales": {"video": 12, "audio": 3},
                                "base_schedule": [1.0, 0.7, 0.4, 0.15, 0.0]}}


def _close(values, expected, tol=1e-6):
    assert len(values) == len(expected)
    assert all(abs(a - b) <= tol for a, b in zip(values, expected)), (values, expected)


@pytest.mark.parametrize("name, metadata, steps, shift, tasks, alpha", TURBO_MATRIX)
def test_published_turbo_names_parse_to_their_contract(name, metadata, steps, shift, tasks, alpha):
    contract = mm.declared_contract(name, metadata, 128)
    assert (contract.kind, contract.steps, contract.shift, contract.audio_shift) == ("turbo", steps, shift, 3.0)
    assert contract.tasks == tasks and contract.alpha == alpha and contract.rank == 128
    assert contract.partition == ("transformer_ref" if tasks == ("ref2va",) else "transformer")
    assert len(contract.sigmas) == steps + 1 and contract.sigmas[-1] == 0.0
    _close(contract.sigmas, PUBLISHED_SIGMAS[(steps, shift)])
    _close(contract.audio_sigmas, PUBLISHED_SIGMAS[(steps, 3.0)])


@pytest.mark.parametrize("name", [
    "adapter_model.safetensors",
    "minimax_h3_fl2v_turbo_v1.0_768p_bf16.safetensors",
    "minimax_h3_t2v_turbo_4step_v1.0.safetensors",
    "minimax_h3_fl2v_turbo_0step_v1.0_768p_bf16.safetensors",
])
def test_names_outside_the_grammar_declare_no_contract(name):
    assert mm.declared_contract(name, {}, 128) is None


@pytest.mark.parametrize("name, suggestion", [
    ("minimax_h3_fl2v_turbo_4step_v1.0_768p_comfyui_bf16.safetensors",
     "minimax_h3_fl2v_turbo_4step_v1.0_768p_bf16.safetensors"),
    ("minimax_h3_ref2v_turbo_8step_v1.0_768p_comfyui_bf16.safetensors",
     "minimax_h3_ref2v_turbo_8step_v1.0_768p_bf16.safetensors"),
    ("minimax_h3_fl2v_turbo_8step_v1.0_comfyui_bf16.safetensors", "minimax_h3_fl2v_turbo_8step_v1.0_bf16.safetensors"),
    ("minimax_h3_ref2v_turbo_4step_v0.1_comfyui_bf16.safetensors",
     "minimax_h3_ref2v_turbo_4step_v0.1_bf16.safetensors"),
    ("minimax_h3_fl2v_lightx2v_turbo_4step_v0.1_comfy.safetensors", "minimax_h3_fl2v_turbo_4step_v0.1.safetensors"),
])
def test_comfyui_fused_qkv_exports_are_refused_pointing_to_the_diffusers_export(name, suggestion):
    with pytest.raises(ContractError) as err:
        mm.declared_contract(name, {}, 128)
    assert name in str(err.value) and "ComfyUI-layout" in str(err.value) and suggestion in str(err.value)


def test_turbo_metadata_with_unparseable_name_is_refused():
    with pytest.raises(ContractError, match="carries MiniMax-H3 Turbo metadata.*cannot be determined"):
        mm.declared_contract("my_turbo_renamed.safetensors", {"key_format": "minimax-h3-diffusers"}, 128)


def test_a_turbo_name_with_a_step_count_no_sampler_can_run_is_refused_before_any_table_is_built():
    name = "minimax_h3_fl2v_turbo_1000000000step_v1.0.safetensors"
    assert mm.parse_turbo_name(name) is None and mm.parse_turbo_name(name.replace("1000000000", "4"))["steps"] == 4
    with pytest.raises(ContractError, match=f"'{name}' carries MiniMax-H3 Turbo metadata.*cannot be determined"):
        mm.declared_contract(name, {"key_format": "minimax-h3-diffusers"}, 128)


@pytest.mark.parametrize("metadata, message", [
    ({"key_format": "minimax-h3-comfy"}, "key_format='minimax-h3-comfy'; expected 'minimax-h3-diffusers'"),
    ({"alpha": "eight"}, "alpha='eight' must be numeric"),
    ({"alpha": "-8"}, "alpha='-8' must be a positive number"),
])
def test_turbo_metadata_errors_name_the_file_and_field(metadata, message):
    name = "minimax_h3_fl2v_turbo_4step_v1.0_768p_bf16.safetensors"
    with pytest.raises(ContractError) as err:
        mm.declared_contract(name, metadata, 128)
    assert name in str(err.value) and message in str(err.value)


NATIVE_NAME = "minimax_h3_t2va_flashgen_4step_v1.0_768p_bf16.safetensors"
NATIVE_META = {"key_format": "minimax-h3-native", "qkv_layout": "grouped", "lora_rank": "64", "lora_alpha": "64",
               "tasks": "t2va", "base_schedule": "1.0,0.7,0.4,0.15,0.0"}


def test_native_metadata_declares_interval_count_and_base_schedule():
    contract = mm.declared_contract(NATIVE_NAME, NATIVE_META, 64)
    assert (contract.kind, contract.steps, contract.tasks, contract.alpha, contract.rank) == (
        "native", 4, ("t2va",), 64.0, 64)
    assert contract.base_schedule == (1.0, 0.7, 0.4, 0.15, 0.0) and contract.shift is None


@pytest.mark.parametrize("change, message", [
    ({"qkv_layout": "qkv"}, "qkv_layout='grouped'"),
    ({"base_schedule": ""}, "requires safetensors metadata base_schedule"),
    ({"base_schedule": "1.0,0.4,0.7,0.0"}, "strictly decreasing"),
    ({"base_schedule": "0.9,0.5,0.0"}, "must start at 1.0 and end at 0.0"),
    ({"lora_rank": "32"}, "lora_rank=32 but the tensors have rank 64"),
    ({"tasks": "t2v"}, "names no known task"),
])
def test_native_metadata_errors(change, message):
    with pytest.raises(ContractError) as err:
        mm.declared_contract(NATIVE_NAME, {**NATIVE_META, **change}, 64)
    assert NATIVE_NAME in str(err.value) and message in str(err.value)


def test_checkpoint_pinned_schedule_is_shifted_by_the_checkpoint_scales():
    contract = mm.checkpoint_contract(PINNED_INDEX, "tiny-minimax-h3-pinned")
    assert (contract.kind, contract.steps, contract.partition) == ("pinned", 4, "transformer")
    _close(contract.sigmas, PINNED_VIDEO_12)
    _close(contract.audio_sigmas, PINNED_AUDIO_3)
    assert mm.checkpoint_contract({"_class_name": "MiniMaxH3ModularPipeline"}, "tiny-minimax-h3") is None


INSPECT_KEYS = {"kind", "steps", "sigma_points", "flow_shift", "audio_flow_shift", "tasks", "alpha", "rank", "scale",
                "base_schedule"}


def test_contract_dict_has_the_inspect_fields():
    native = mm.contract_dict(mm.with_scale(mm.declared_contract(NATIVE_NAME, NATIVE_META, 64), 0.5))
    assert INSPECT_KEYS <= native.keys()
    assert {k: native[k] for k in ("kind", "steps", "sigma_points", "tasks", "alpha", "rank")} == {
        "kind": "native", "steps": 4, "sigma_points": 5, "tasks": ["t2va"], "alpha": 64.0, "rank": 64}
    # scale is the file's alpha / rank; the node's multiplier is reported beside it
    assert (native["scale"], native["request_scale"], native["effective_scale"]) == (1.0, 0.5, 0.5)
    assert native["base_schedule"] == [1.0, 0.7, 0.4, 0.15, 0.0]
    turbo = mm.contract_dict(mm.declared_contract(TURBO_MATRIX[1][0], TURBO_MATRIX[1][1], 128))
    assert (turbo["kind"], turbo["sigma_points"], turbo["flow_shift"], turbo["audio_flow_shift"]) == (
        "turbo", 5, 6.0, 3.0)
    assert turbo["base_schedule"] is None and turbo["tasks"] == ["t2va", "fl2va"]
    assert (turbo["scale"], turbo["request_scale"], turbo["effective_scale"]) == (1.0, None, None)
    v01 = mm.contract_dict(mm.with_scale(mm.declared_contract(TURBO_MATRIX[0][0], {}, 128), 2.0))
    assert (v01["alpha"], v01["scale"], v01["effective_scale"]) == (8.0, 8.0 / 128, 2.0 * 8.0 / 128)


def test_native_contract_on_a_checkpoint_carries_its_shifted_schedules():
    native = mm.declared_contract(NATIVE_NAME, NATIVE_META, 64)
    assert native.sigmas is None  # without a model its shifts are the checkpoint's, unknown yet
    index = {"_minimax_h3": {"sigma_shift_scales": {"video": 6, "audio": 2}}}
    placed = mm.on_checkpoint(native, index)
    assert (placed.shift, placed.audio_shift) == (6.0, 2.0)
    _close(placed.sigmas, [6 * u / (1 + 5 * u) for u in (1.0, 0.7, 0.4, 0.15, 0.0)])
    _close(placed.audio_sigmas, [2 * u / (1 + u) for u in (1.0, 0.7, 0.4, 0.15, 0.0)])
    _close(mm.on_checkpoint(native, {}).sigmas, PINNED_VIDEO_12)
    turbo = mm.declared_contract(TURBO_MATRIX[1][0], {}, 128)
    assert mm.on_checkpoint(turbo, index) is turbo


def test_contract_reads_the_file_name_of_a_path_under_the_loras_root():
    contract = mm.declared_contract("turbo/" + TURBO_MATRIX[1][0], {}, 128)
    assert (contract.source, contract.steps, contract.shift) == (TURBO_MATRIX[1][0], 4, 6.0)


@pytest.mark.parametrize("schedule, message", [
    ([1.0, 0.7, 0.7, 0.0], "strictly decreasing"),
    ([1.0, float("nan"), 0.0], "non-finite"),
    ([1.0], "at least 2 sigma points"),
    ({"video": [1.0, 0.0]}, "not a mapping"),
])
def test_invalid_pinned_schedule_is_refused_naming_the_checkpoint(schedule, message):
    index = {"_minimax_h3": {"base_schedule": schedule}}
    with pytest.raises(ContractError) as err:
        mm.checkpoint_contract(index, "my-merged-h3")
    assert "my-merged-h3" in str(err.value) and message in str(err.value)


def test_fixture_files_carry_the_published_matrix(mm_root):
    """The files ``build-tiny`` writes (published names and metadata, tiny rank) read back to the matrix."""
    from lorabind.loaders.families.minimax_h3.contracts import file_contract
    from lorabind.tiny_models.minimax_h3 import FIXTURE_RANK

    for name, _, steps, shift, tasks, alpha in TURBO_MATRIX:
        contract = file_contract(mm_root / "loras" / "lorabind-tiny" / name)
        assert (contract.steps, contract.shift, contract.audio_shift, contract.tasks, contract.alpha) == (
            steps, shift, 3.0, tasks, alpha), name
        assert contract.rank == FIXTURE_RANK
    native = file_contract(mm_root / "loras" / "lorabind-tiny" / NATIVE_NAME)
    assert (native.kind, native.steps, native.base_schedule, native.rank) == (
        "native", 4, (1.0, 0.7, 0.4, 0.15, 0.0), FIXTURE_RANK)


def test_the_generic_contract_view_uses_the_minimax_keys_for_every_caller():
    """Node UIs (LoadPEFTAdapter, the sampler) and inspect all go through contracts.contract_to_dict."""
    from lorabind.loaders.dispatch.contract_discovery import contract_to_dict

    contract = mm.declared_contract("minimax_h3_fl2v_turbo_4step_v1.0_768p_bf16.safetensors", {}, 4)
    view = contract_to_dict(contract)
    assert {key: view[key] for key in ("kind", "steps", "sigma_points", "flow_shift", "audio_flow_shift")} == {
        "kind": "turbo", "steps": 4, "sigma_points": 5, "flow_shift": 6.0, "audio_flow_shift": 3.0}
    assert view["text"] == mm.describe_contract(contract)


def test_adapter_node_ui_words_a_minimax_contract_in_its_own_terms():
    from lorabind.usecases.adapters import contract_text

    contract = mm.declared_contract("minimax_h3_fl2v_turbo_8step_v1.0_bf16.safetensors", {}, 4)
    assert contract_text(contract) == ["contract: " + mm.describe_contract(contract)]
    assert "flow_shift=12" in contract_text(contract)[0]
