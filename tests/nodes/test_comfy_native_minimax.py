"""MiniMax-H3 on a host's own model, without ComfyUI: ComfyUI 0.30's MiniMax-H3 MODEL is known by its state dict's
native names (fused ``qkv_proj`` as [Q; K; V], ``mlp.fc1`` as [gate; value]). Every MiniMax-H3 fixture LoRA (the
Turbo names, the native FlashGen layout) maps onto those names with every tensor accounted for, and the value the
host's patcher gets for each weight is our own fuse's, bit for bit in the host's bfloat16. The contract check a
ComfyUI sampler run gets: the video table and its flow_shift (6 at 768p, else 12), and the audio schedule
ComfyUI's model derives from the video sigmas (``MiniMaxH3SigmaShift``'s shifts)."""

import pytest
import torch

from lorabind.loaders.binding import bind as binding
from lorabind.loaders.contracts.sigmas import shifted_sigmas
from lorabind.loaders.errors import ContractError
from lorabind.loaders.families.minimax_h3.contracts import declared_contract
from lorabind.loaders.families.minimax_h3.key_layouts import MINIMAX_H3_TRANSFORMER as LAYOUT
from lorabind.loaders.handles import FuseSpec
from lorabind.loaders.models.store import load_model
from lorabind.usecases import host_models as hm
from lorabind.usecases import host_sampling as hs

PREFIX = "diffusion_model."
TURBO_768P = "minimax_h3_fl2v_turbo_4step_v1.2_768p_bf16.safetensors"
TURBO_544P = "minimax_h3_fl2v_turbo_8step_v1.0_bf16.safetensors"
NATIVE = "minimax_h3_t2va_flashgen_4step_v1.0_768p_bf16.safetensors"


def _native_state(model) -> dict:
    """The transformer's weights under the native names ComfyUI's MiniMax-H3 model has (fused tensors joined)."""
    state = model.components["transformer"].state_dict()
    return {native: LAYOUT.join(native, [state[key] for key in held]).detach().clone()
            for native, held in LAYOUT.native_plan(state).items()}


@pytest.fixture(scope="module")
def bf16_model(mm_root):
    return load_model(mm_root / "diffusers" / "tiny-minimax-h3", dtype="bfloat16")


def _fixtures(mm_root):
    return sorted((mm_root / "loras").rglob("minimax_h3_*.safetensors"))


def test_every_minimax_fixture_maps_onto_the_native_names_and_patches_as_our_fuse_bit_for_bit(mm_root, bf16_model):
    original = _native_state(bf16_model)
    shapes = {PREFIX + key: tuple(value.shape) for key, value in original.items()}
    dtypes = {PREFIX + key: str(value.dtype) for key, value in original.items()}
    paths = _fixtures(mm_root)
    assert len(paths) == 9  # the eight Turbo names and the native FlashGen file
    for path in paths:
        prepared = hm.prepare_host_lora(shapes, "ComfyUI MiniMax-H3", path.name, str(path), 0.75, lenient=False,
                                        where="test", dtypes=dtypes)
        assert prepared.report["counts"]["unmatched"] == 0, path.name
        binding.bind(bf16_model, [FuseSpec(str(path), 0.75, "transformer", path.name)], [])
        try:
            ours = _native_state(bf16_model)
        finally:
            binding.unbind(bf16_model)
        changed = {key for key in ours if not ours[key].equal(original[key])}
        assert {key.removeprefix(PREFIX) for key in prepared.deltas} == changed, path.name
        for key, patch in prepared.deltas.items():
            native = key.removeprefix(PREFIX)
            theirs = patch.value(original[native].float(), 0.75).to(original[native].dtype)
            assert theirs.equal(ours[native]), (path.name, native)


def test_a_fused_qkv_is_patched_part_by_part_and_fc1_keeps_comfyui_gate_first_order(mm_root, bf16_model):
    original = _native_state(bf16_model)
    shapes = {PREFIX + key: tuple(value.shape) for key, value in original.items()}
    path = next(p for p in _fixtures(mm_root) if p.name == TURBO_768P)
    prepared = hm.prepare_host_lora(shapes, "m", path.name, str(path), 1.0, lenient=False, where="test")
    qkv = prepared.deltas[PREFIX + "blocks.0.attn.qkv_proj.weight"]
    assert [key for key, _ in qkv.parts] == [f"transformer_blocks.0.attn.to_{p}.weight" for p in "qkv"]
    fc1 = prepared.deltas[PREFIX + "blocks.0.mlp.fc1.weight"]
    assert [key for key, _ in fc1.parts] == ["transformer_blocks.0.ff.net.0.proj.weight"]
    weight = original["blocks.0.mlp.fc1.weight"].float()
    gate_half = weight.shape[0] // 2
    patched = fc1.value(weight, 1.0)
    (delta,) = fc1.parts[0][1]
    expected = torch.zeros(weight.shape[0], weight.shape[1])
    delta.row_adder("cpu", None)(expected, 0, weight.shape[0], 1.0)  # diffusers order: [value; gate]
    torch.testing.assert_close(patched[:gate_half] - weight[:gate_half], expected[gate_half:], atol=1e-6, rtol=1e-4)


def _record(name, part=hm.PART_ANY):
    from lorabind.loaders.families.minimax_h3.host import on_host

    return hm.HostContract(on_host(declared_contract(name, {}, 4)), part)


SHIFT_VIDEO, SHIFT_AUDIO = "minimax_h3_sigma_shift_video", "minimax_h3_sigma_shift_audio"


def _check(records, sigmas, options, condition_keys=frozenset()) -> list:
    """A ComfyUI sampler run at cfg 1 with these transformer options and positive-conditioning keys."""
    run = hs.HostRun(tuple(sigmas), hs.plain_cfg(1.0), "euler", options, frozenset(condition_keys))
    return hs.check_sampling(records, run)


REF2V_8STEP_768P = "minimax_h3_ref2v_turbo_8step_v1.0_768p_bf16.safetensors"


@pytest.mark.parametrize("keys, refused", [
    ((), "task 't2va' (no references or keyframes)"),  # EmptyMiniMaxH3LatentAV / MiniMaxH3ImageToVideo, no frame
    (("minimax_keyframes",), "task 'fl2va' (MiniMaxH3ImageToVideo with a frame)"),
    (("minimax_refs",), None),  # MiniMaxH3ReferenceToVideo with references: what the file is for
])
def test_a_ref2v_turbo_file_is_refused_on_a_conditioning_of_another_task(keys, refused):
    """Issue 57: in native mode a ref2v Turbo file ran on a plain text-to-video latent ("contract enforced:
    tasks=ref2va"), where ``lorabind run`` refuses the same; the task is the positive conditioning's."""
    record = _record(REF2V_8STEP_768P)
    sigmas, options = record.contract.sigmas, {SHIFT_VIDEO: 6.0}
    if refused is None:
        assert _check([record], sigmas, options, keys) == []
        return
    with pytest.raises(ContractError) as caught:
        _check([record], sigmas, options, keys)
    message = str(caught.value)
    assert REF2V_8STEP_768P in message and "task: it serves tasks ['ref2va']" in message and refused in message
    assert "condition it with MiniMaxH3ReferenceToVideo with references" in message
    off = hm.HostContract(record.contract, enforced=False)
    (line,) = _check([off], sigmas, options, keys)
    assert "not enforced" in line and "task:" in line


def test_a_544p_turbo_file_runs_on_comfyui_defaults_and_a_768p_one_needs_minimax_sigma_shift_at_6():
    assert _check([_record(TURBO_544P)], shifted_sigmas(8, 12.0), {}) == []
    both = {SHIFT_VIDEO: 6.0, SHIFT_AUDIO: 3.0}
    assert _check([_record(TURBO_768P)], shifted_sigmas(4, 6.0), both) == []
    with pytest.raises(ContractError) as audio:  # ModelSamplingSD3 at 6 alone: the DiT still assumes 12
        _check([_record(TURBO_768P)], shifted_sigmas(4, 6.0), {})
    message = str(audio.value)
    assert TURBO_768P in message and "audio_flow_shift" in message and "shift_video=6, shift_audio=3" in message
    with pytest.raises(ContractError, match="audio_flow_shift"):
        _check([_record(TURBO_544P)], shifted_sigmas(8, 12.0), {SHIFT_AUDIO: 5.0})


@pytest.mark.parametrize("name, sigmas, field", [
    (TURBO_768P, shifted_sigmas(4, 12.0), "flow_shift: it needs flow_shift=6 (its name says _768p)"),
    (TURBO_544P, shifted_sigmas(8, 6.0), "flow_shift: it needs flow_shift=12 (its name has no _768p)"),
    (TURBO_768P, shifted_sigmas(8, 6.0), "steps/sigmas"),
])
def test_the_wrong_shift_or_step_count_is_refused_naming_the_file_and_the_field(name, sigmas, field):
    with pytest.raises(ContractError) as refused:
        _check([_record(name)], sigmas, {SHIFT_VIDEO: 6.0})
    assert name in str(refused.value) and field in str(refused.value)


def test_a_native_adapter_pins_its_base_schedule_shifted_as_the_host_model_shifts_it():
    metadata = {"key_format": "minimax-h3-native", "qkv_layout": "grouped", "lora_rank": "4", "lora_alpha": "4",
                "tasks": "t2va", "base_schedule": "1.0,0.7,0.4,0.15,0.0"}
    from lorabind.loaders.families.minimax_h3.host import on_host

    contract = on_host(declared_contract(NATIVE, metadata, 4))
    assert contract.shift == 12.0 and contract.audio_shift == 3.0
    record = hm.HostContract(contract)
    assert _check([record], list(contract.sigmas), {}) == []
    with pytest.raises(ContractError, match="steps/sigmas"):
        _check([record], shifted_sigmas(4, 12.0), {})


def test_a_lora_in_comfyui_own_native_names_lands_on_the_fused_tensors_row_for_row(mm_root, bf16_model, tmp_path):
    """A MiniMax-H3 LoRA trained on the native names (``diffusion_model.`` prefix, ``lora_down``/``lora_up``, fused
    ``qkv_proj`` and ``fc1`` in the checkpoint's own row order, no published contract): our key map splits them
    into diffusers' separate projections and the host patch joins them back, so each fused tensor gets exactly
    ``up @ down`` in its own row order."""
    from safetensors.torch import save_file

    original = _native_state(bf16_model)
    shapes = {PREFIX + key: tuple(value.shape) for key, value in original.items()}
    generator = torch.Generator().manual_seed(5)
    factors = {}
    for module in ("blocks.1.attn.qkv_proj", "blocks.0.mlp.fc1", "token_refiner.blocks.0.attn.qkv_proj"):
        rows, columns = original[f"{module}.weight"].shape
        factors[module] = (torch.randn(rows, 2, generator=generator) * 0.1, torch.randn(2, columns, generator=generator))
    tensors = {f"{PREFIX}{module}.lora_{part}.weight": tensor.contiguous()
               for module, (up, down) in factors.items() for part, tensor in (("up", up), ("down", down))}
    path = tmp_path / "my_minimax_style.safetensors"
    save_file(tensors, str(path))
    prepared = hm.prepare_host_lora(shapes, "m", path.name, str(path), 1.0, lenient=False, where="test")
    # counted after the split: each fused qkv pair is three pairs (to_q, to_k, to_v)
    assert prepared.report["counts"] == {"applied": 14, "expected_unmatched": 0, "unmatched": 0}
    for module, (up, down) in factors.items():
        weight = original[f"{module}.weight"].float()
        patched = prepared.deltas[f"{PREFIX}{module}.weight"].value(weight, 1.0)
        torch.testing.assert_close(patched, (weight + up @ down).to(torch.bfloat16).float(), atol=0, rtol=2 ** -7)
