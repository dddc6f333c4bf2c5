"""Key map: names, grouped fused-QKV reorder and SwiGLU half order verified numerically on the tiny model."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import save_file

from lorabind.loaders.binding import bind as binding
from lorabind.loaders.dispatch.contract_discovery import ResolvedSchedule
from lorabind.loaders.families import family_by_id
from lorabind.loaders.families.minimax_h3 import FAMILY, pipeline
from lorabind.loaders.families.minimax_h3 import keymap as mm
from lorabind.loaders.handles import FuseSpec
from lorabind.loaders.lora import read_lora
from lorabind.tiny_models.minimax_h3 import TRANSFORMER_CONFIG, native_metadata

HEADS, HEAD_DIM = TRANSFORMER_CONFIG["num_attention_heads"], TRANSFORMER_CONFIG["attention_head_dim"]
HIDDEN, FFN = TRANSFORMER_CONFIG["hidden_size"], TRANSFORMER_CONFIG["ffn_dim"]
RANK = 4


@pytest.mark.parametrize("name, target", [
    ("blocks.1.attn.to_q", "transformer_blocks.1.attn.to_q"),
    ("blocks.0.attn.out_proj", "transformer_blocks.0.attn.to_out.0"),
    ("blocks.0.mlp.fc1", "transformer_blocks.0.ff.net.0.proj"),
    ("blocks.0.mlp.fc2", "transformer_blocks.0.ff.net.2"),
    ("blocks.0.adaln_proj.linear", "transformer_blocks.0.adaln_proj.linear"),
    ("token_refiner.blocks.0.attn.to_v", "token_refiner.refiner_blocks.0.attn.to_v"),
    ("final_layer.adaln_proj.linear", "norm_out.linear"),
    ("video_patch_proj", "proj_in"),
    ("transformer_blocks.0.ff.net.0.proj", "transformer_blocks.0.ff.net.0.proj"),
    ("token_refiner.refiner_blocks.0.attn.to_out.0", "token_refiner.refiner_blocks.0.attn.to_out.0"),
    ("blocks.0.self_attn.q", None),
    ("transformer_blocks.0.img_mlp.net.0.proj", None),
])
def test_map_target(name, target):
    assert mm.map_target(name) == target


def test_fixture_files_are_recognized_and_map_with_zero_unmatched(mm_root):
    from lorabind.loaders.lora import map_to_model

    for path in sorted((mm_root / "loras" / "lorabind-tiny" / "lorabind-tiny").glob("minimax_h3_*.safetensors")):
        lf = read_lora(str(path))
        assert mm.recognizes(lf), path.name
        mapped = map_to_model(lf, "minimax_h3", family_by_id("minimax_h3"))
        assert mapped.unmatched == [] and all(mm.map_target(t) == t for t in mapped.targets)


@pytest.mark.parametrize("names, expected", [
    (["blocks.0.attn.qkv_proj", "blocks.0.mlp.fc1"], True),
    (["token_refiner.refiner_blocks.0.attn.to_q"], True),
    (["transformer_blocks.0.ff.net.0.proj", "transformer_blocks.0.attn.to_q"], True),
    (["blocks.0.self_attn.q", "blocks.0.ffn.0"], False),  # Wan native
    (["transformer_blocks.0.attn.to_q", "transformer_blocks.0.img_mlp.net.0.proj"], False),  # Qwen-Image
])
def test_recognizes_by_module_names(names, expected):
    from lorabind.loaders.lora import LoraFile

    lf = LoraFile(path="x", name="some_lora.safetensors", format="diffusers", metadata={},
                  targets={n: None for n in names})
    assert mm.recognizes(lf) is expected


def test_reorder_grouped_qkv_two_groups():
    rows = torch.arange(2 * 3 * 2, dtype=torch.float32).reshape(-1, 1)  # groups [q0 k0 v0 | q1 k1 v1], 2 rows each
    reordered = mm.reorder_grouped_qkv(rows, head_dim=2)
    assert reordered.flatten().tolist() == [0, 1, 6, 7, 2, 3, 8, 9, 4, 5, 10, 11]


def _pairs(prefix, down, up):
    return {f"transformer.{prefix}.lora_A.default.weight": down.clone(),
            f"transformer.{prefix}.lora_B.default.weight": up.clone()}


def _one_step(model, seed=3):
    """One transformer evaluation through the real sampler (video + audio), deterministic."""
    pos = pipeline.encode_prompt(model, "a cat dances")
    latent = pipeline.empty_latents(model, 32, 32, 2)
    schedule = ResolvedSchedule(sigmas=(1.0, 0.0), audio_sigmas=(1.0, 0.0), steps=1, cfg=1.0, shift=12.0, task="t2va")
    out = FAMILY.sampling.denoise(model, pos, None, latent, schedule, seed)
    return out.samples, out.extra["audio"]


@pytest.mark.slow
def test_grouped_qkv_native_lora_equals_the_same_delta_on_to_q_to_k_to_v(mm_models, tmp_path):
    model = mm_models["plain"]
    g = torch.Generator().manual_seed(7)
    native, direct = {}, {}
    for block in range(TRANSFORMER_CONFIG["num_layers"]):
        down = torch.randn(RANK, HIDDEN, generator=g) * 0.2
        up = torch.randn(3 * HEADS * HEAD_DIM, RANK, generator=g) * 0.2  # rows per head: [q_h; k_h; v_h]
        native.update(_pairs(f"blocks.{block}.attn.qkv_proj", down, up))
        heads = up.reshape(HEADS, 3, HEAD_DIM, RANK)
        for i, proj in enumerate(("to_q", "to_k", "to_v")):
            direct.update(_pairs(f"transformer_blocks.{block}.attn.{proj}", down, heads[:, i].reshape(-1, RANK)))
    native_path, direct_path = tmp_path / "native_qkv.safetensors", tmp_path / "direct_qkv.safetensors"
    save_file(native, str(native_path), metadata=native_metadata(RANK))
    save_file(direct, str(direct_path))

    base = _one_step(model)
    outputs = []
    for path in (native_path, direct_path):
        binding.bind(model, [FuseSpec(str(path), 1.0, "transformer", name=path.name)], [])
        try:
            outputs.append(_one_step(model))
        finally:
            binding.unbind(model)
    (native_video, native_audio), (direct_video, direct_audio) = outputs
    assert (native_video - base[0]).abs().max() > 1e-3  # the delta really changes the output
    torch.testing.assert_close(native_video, direct_video, rtol=0, atol=1e-5)
    torch.testing.assert_close(native_audio, direct_audio, rtol=0, atol=1e-5)
    torch.testing.assert_close(_one_step(model)[0], base[0], rtol=0, atol=0)  # unbind restored the base


def test_native_fc1_half_order_matches_the_reference_swiglu(mm_models, tmp_path):
    """Native fc1 rows are [gate; value] and compute fc2(silu(gate) * value); diffusers' ff must do the same."""
    model = mm_models["plain"]
    ff = model.components["transformer"].transformer_blocks[0].ff
    g = torch.Generator().manual_seed(11)
    down, up = torch.randn(RANK, HIDDEN, generator=g) * 0.3, torch.randn(2 * FFN, RANK, generator=g) * 0.3
    path = tmp_path / "native_fc1.safetensors"
    save_file(_pairs("blocks.0.mlp.fc1", down, up), str(path), metadata=native_metadata(RANK))

    weight = ff.net[0].proj.weight.detach().clone()  # diffusers rows: [value; gate]
    native_fc1 = torch.cat([weight[FFN:], weight[:FFN]]) + up @ down  # native rows: [gate; value], plus the delta
    x = torch.randn(5, HIDDEN, generator=g)
    gate, value = (x @ native_fc1.t()).chunk(2, dim=-1)
    expected = (F.silu(gate) * value) @ ff.net[2].weight.detach().t()

    binding.bind(model, [FuseSpec(str(path), 1.0, "transformer", name=path.name)], [])
    try:
        with torch.no_grad():
            got = ff(x)
    finally:
        binding.unbind(model)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


def test_turbo_without_alpha_binds_at_alpha_8_not_rank(mm_models, mm_root):
    """v0.1 declares no alpha: the delta is 8/rank x B@A (the LightX2V default), not rank/rank as diffusers does."""
    from safetensors.torch import load_file

    model = mm_models["plain"]
    name = "minimax_h3_fl2v_turbo_4step_v0.1.safetensors"
    path = mm_root / "loras" / "lorabind-tiny" / name
    tensors = load_file(str(path))
    down = tensors["transformer_blocks.1.attn.to_out.0.lora_A.default.weight"].float()
    up = tensors["transformer_blocks.1.attn.to_out.0.lora_B.default.weight"].float()
    layer = model.components["transformer"].transformer_blocks[1].attn.to_out[0]
    before = layer.weight.detach().clone()
    binding.bind(model, [FuseSpec(str(path), 0.5, "transformer", name=name)], [])
    try:
        delta = layer.weight.detach() - before
    finally:
        binding.unbind(model)
    torch.testing.assert_close(delta, 0.5 * (8.0 / down.shape[0]) * (up @ down), rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("copy_as", ["minimax_h3_fl2v_turbo_4step_v1.0_768p_comfyui_bf16.safetensors",
                                     "minimax_h3_fl2v_lightx2v_turbo_4step_v0.1_comfy.safetensors",
                                     "my_renamed_turbo.safetensors"])
def test_files_with_unknowable_contract_are_never_mapped_for_binding(copy_as, mm_root, tmp_path):
    """Not only the contract reader refuses them: the key map does too, so no fuse/adapter/merge path binds them."""
    import shutil

    from lorabind.loaders.errors import ContractError
    from lorabind.loaders.lora import map_to_model

    path = tmp_path / copy_as
    shutil.copy(mm_root / "loras" / "lorabind-tiny" / "minimax_h3_fl2v_turbo_4step_v1.0_768p_bf16.safetensors", path)
    with pytest.raises(ContractError, match=copy_as.replace(".", r"\.")):
        map_to_model(read_lora(str(path)), "minimax_h3", family_by_id("minimax_h3"))


def test_native_mapping_agrees_with_diffusers_own_converter(mm_root):
    """An independent oracle: diffusers' ``_convert_non_diffusers_minimax_h3_lora_to_diffusers`` de-interleaves a
    per-head fused QKV (its DiffSynth path, recognised by the ``.default.`` infix) and swaps the fc1 halves. Our
    grouped reorder and SwiGLU swap must give the same ``lora_B`` rows for every target of the native fixture."""
    from diffusers.loaders.lora_conversion_utils import _convert_non_diffusers_minimax_h3_lora_to_diffusers
    from safetensors.torch import load_file

    from lorabind.loaders.lora import map_to_model
    from lorabind.tiny_models.minimax_h3 import NATIVE_FIXTURE_NAME

    path = mm_root / "loras" / "lorabind-tiny" / NATIVE_FIXTURE_NAME
    raw = {k.removeprefix("transformer."): v.float() for k, v in load_file(str(path)).items()}
    theirs = _convert_non_diffusers_minimax_h3_lora_to_diffusers(raw)
    ours = map_to_model(read_lora(str(path)), "minimax_h3", family_by_id("minimax_h3")).targets
    assert {f"transformer.{name}.lora_B.weight" for name in ours} == {k for k in theirs if ".lora_B." in k}
    for name, patch in ours.items():
        assert patch.low_rank.scale == 1.0  # lora_alpha / lora_rank = 1: diffusers applies B @ A as is
        torch.testing.assert_close(patch.low_rank.up.float(), theirs[f"transformer.{name}.lora_B.weight"],
                                   rtol=0, atol=0)
        torch.testing.assert_close(patch.low_rank.down.float(), theirs[f"transformer.{name}.lora_A.weight"],
                                   rtol=0, atol=0)


def test_a_loha_module_in_a_native_file_is_refused_by_name(tmp_path):
    from lorabind.loaders.errors import KeyMatchError
    from lorabind.loaders.lora import map_to_model

    g = torch.Generator().manual_seed(2)
    pre = "blocks.0.attn.qkv_proj"
    sd = {f"{pre}.hada_w{i}_{ab}": torch.randn(*(shape if ab == "a" else shape[::-1]), generator=g)
          for i in (1, 2) for ab, shape in (("a", (3 * HIDDEN, RANK)), ("b", (HIDDEN, RANK)))}
    path = tmp_path / "native_loha.safetensors"
    save_file(sd, str(path), metadata=native_metadata(RANK))
    with pytest.raises(KeyMatchError, match=r"native_loha\.safetensors: module 'blocks\.0\.attn\.qkv_proj' is a loha "
                                            r"adapter; MiniMax-H3 LoRA files are read as plain low-rank pairs"):
        map_to_model(read_lora(str(path)), "minimax_h3", family_by_id("minimax_h3"))
