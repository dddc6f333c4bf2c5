"""LoRAs on the Wan VACE transformer: the lightx2v T2V LoRA binds with full accounting (its keys are the main
blocks'); a LoRA trained on a VACE model (ComfyUI-layout ``vace_blocks.N.*`` with ``before_proj``/``after_proj``
and ``vace_patch_embedding``) binds fully on a VACE model, and on a model without the VACE branch those keys are
reported as expected-unmatched with the reason, never as a failure."""

import pytest
import torch
from safetensors import safe_open

from formats_helpers import save
from lorabind.loaders.families import family_by_id
from lorabind.loaders.families.wan import keymap
from lorabind.loaders.handles import ModelHandle
from lorabind.loaders.lora import account, map_to_model, read_lora
from lorabind.tiny_models import lora_fixtures as F
from lorabind.tiny_models.lora_fixtures import wan_native_lora


def _account(path, module, family="wan2.1"):
    return account(map_to_model(read_lora(path), family, family_by_id(family)), module, component="transformer",
                   lenient=True)


def _vace_trained_lora(model) -> dict:
    """The lightx2v layout of the model's main blocks plus its VACE branch in ComfyUI's names."""
    config = dict(model.components["transformer"].config)
    sd = wan_native_lora(config, seed=301)
    dim = config["num_attention_heads"] * config["attention_head_dim"]
    g = torch.Generator().manual_seed(302)

    def pair(name, in_f, out_f):
        sd[f"diffusion_model.{name}.lora_down.weight"] = torch.randn(F.FIXTURE_RANK, in_f, generator=g)
        sd[f"diffusion_model.{name}.lora_up.weight"] = torch.randn(out_f, F.FIXTURE_RANK, generator=g)

    for index in range(len(config["vace_layers"])):
        block = f"vace_blocks.{index}"
        for attention in ("self_attn", "cross_attn"):
            for projection in ("q", "k", "v", "o"):
                pair(f"{block}.{attention}.{projection}", dim, dim)
        pair(f"{block}.ffn.0", dim, config["ffn_dim"])
        pair(f"{block}.after_proj", dim, dim)
        if index == 0:
            pair(f"{block}.before_proj", dim, dim)
    sd["diffusion_model.vace_patch_embedding.diff_b"] = torch.randn(dim, generator=g)
    return sd


@pytest.mark.parametrize("name, lora", [("tiny-wan21-vace", F.WAN21_DISTILL),
                                        ("tiny-wan22-vace-fun", F.WAN22_HIGH)])
def test_the_lightx2v_lora_binds_to_the_vace_transformer_with_full_accounting(registry, load_tiny, tiny_models_root,
                                                                               name, lora):
    from lorabind.nodes import NODE_CLASS_MAPPINGS

    model = load_tiny(name)
    result = NODE_CLASS_MAPPINGS["FuseDistillLoRA"]().fuse(ModelHandle(model), lora, 1.0)
    report = result["ui"]["lorabind_accounting"][0]
    with safe_open(str(tiny_models_root / "loras" / lora), "pt") as handle:
        file_keys = len(list(handle.keys()))
    assert report["counts"] == {"applied": file_keys, "expected_unmatched": 0, "unmatched": 0}
    assert report["component"] == "transformer"


def test_the_wan22_lightx2v_pair_binds_to_the_vace_fun_experts_with_full_accounting(registry, load_tiny):
    """The Wan2.2 VACE Fun experts take the T2V A14B pair as the T2V experts do: high into transformer, low into
    transformer_2, every key of both files applied."""
    from lorabind.nodes import NODE_CLASS_MAPPINGS

    result = NODE_CLASS_MAPPINGS["WanMoELoRAPair"]().pair(ModelHandle(load_tiny("tiny-wan22-vace-fun")),
                                                         F.WAN22_HIGH, 1.0, F.WAN22_LOW, 1.0)
    reports = result["ui"]["lorabind_accounting"]
    assert [r["component"] for r in reports] == ["transformer", "transformer_2"]
    for report in reports:
        assert report["counts"]["unmatched"] == report["counts"]["expected_unmatched"] == 0
        assert report["counts"]["applied"] > 0


def test_a_vace_trained_lora_binds_its_vace_blocks_on_a_vace_model(load_tiny, tmp_path):
    model = load_tiny("tiny-wan21-vace")
    sd = _vace_trained_lora(model)
    acc = _account(save(sd, tmp_path / "vace_lora.safetensors"), model.components["transformer"])
    assert acc.counts == {"applied": len(sd), "expected_unmatched": 0, "unmatched": 0}
    assert torch.equal(acc.applied["vace_blocks.0.proj_in"].low_rank.up,
                       sd["diffusion_model.vace_blocks.0.before_proj.lora_up.weight"])
    assert torch.equal(acc.applied["vace_blocks.1.proj_out"].low_rank.down,
                       sd["diffusion_model.vace_blocks.1.after_proj.lora_down.weight"])
    assert torch.equal(acc.applied["vace_blocks.1.attn2.to_out.0"].low_rank.up,
                       sd["diffusion_model.vace_blocks.1.cross_attn.o.lora_up.weight"])
    assert torch.equal(acc.applied["vace_patch_embedding"].param_diffs["bias"],
                       sd["diffusion_model.vace_patch_embedding.diff_b"])


def test_vace_keys_are_expected_unmatched_on_a_model_without_the_vace_branch(load_tiny, tmp_path):
    vace, t2v = load_tiny("tiny-wan21-vace"), load_tiny("tiny-wan21-t2v")
    sd = _vace_trained_lora(vace)
    # the tiny T2V model has two main blocks, the tiny VACE model four: keep the keys of blocks 0 and 1
    sd = {k: v for k, v in sd.items() if not k.startswith(("diffusion_model.blocks.2.", "diffusion_model.blocks.3."))}
    vace_keys = [k for k in sd if "vace" in k]
    acc = _account(save(sd, tmp_path / "vace_lora.safetensors"), t2v.components["transformer"])
    assert acc.counts == {"applied": len(sd) - len(vace_keys), "expected_unmatched": len(vace_keys),
                          "unmatched": 0}
    assert set(acc.expected_unmatched.values()) == {keymap.VACE_BRANCH_REASON}
    assert not acc.refusal and any("Wan VACE control-branch key" in line for line in acc.warnings)


@pytest.mark.parametrize("file_name, diffusers_name", [
    ("vace_blocks.3.self_attn.q", "vace_blocks.3.attn1.to_q"),
    ("vace_blocks.0.before_proj", "vace_blocks.0.proj_in"),
    ("vace_blocks_2_after_proj", "vace_blocks.2.proj_out"),  # kohya/musubi flattened
    ("vace_blocks_1_cross_attn_k", "vace_blocks.1.attn2.to_k"),
    ("vace_blocks.1.attn1.to_v", "vace_blocks.1.attn1.to_v"),  # already diffusers
    ("vace_blocks.0.modulation", "vace_blocks.0.scale_shift_table"),
    ("vace_patch_embedding", "vace_patch_embedding"),
])
def test_vace_names_map_onto_the_diffusers_vace_transformer(file_name, diffusers_name):
    assert keymap.map_target(file_name) == diffusers_name


def test_inside_comfyui_a_vace_host_model_takes_a_vace_trained_lora_with_full_accounting(load_tiny, tmp_path):
    """ComfyUI hands over its VACE MODEL by its native keys (``diffusion_model.vace_blocks.0.before_proj...``): it is
    recognised as a VACE denoiser (not as the plain Wan one its other keys also look like), so the LoRA's VACE keys
    find their host weights."""
    from lorabind.loaders.families.wan.key_layouts import WAN_VACE_TRANSFORMER
    from lorabind.usecases import host_models

    model = load_tiny("tiny-wan21-vace")
    sd = _vace_trained_lora(model)
    path = save(sd, tmp_path / "vace_lora.safetensors")
    shapes = {f"diffusion_model.{WAN_VACE_TRANSFORMER.to_native(key)}": tuple(value.shape)
              for key, value in model.components["transformer"].state_dict().items()}
    prepared = host_models.prepare_host_lora(shapes, "tiny-wan21-vace", "vace_lora.safetensors", path, 1.0,
                                             lenient=False, where="test")
    assert prepared.report["counts"] == {"applied": len(sd), "expected_unmatched": 0, "unmatched": 0}
    assert "diffusion_model.vace_blocks.0.before_proj.weight" in prepared.deltas
    assert "diffusion_model.vace_blocks.1.self_attn.q.weight" in prepared.deltas
