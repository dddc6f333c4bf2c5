"""Wan LoRAs in every layout onto the tiny Wan transformers: mapping, expected-unmatched, accounting errors."""

import json

import pytest
import torch

from formats_helpers import effective_deltas, qwen_lora, rename, save, wan_native_lora
from lorabind.loaders import families
from lorabind.loaders.errors import KeyMatchError
from lorabind.loaders.families import family_by_id, wan
from lorabind.loaders.families.wan import keymap as wan_keymap
from lorabind.loaders.lora import account, map_to_model, read_lora

IMAGE_PARTS = ("k_img", "v_img", "norm_k_img", "img_emb")


def _account(path, model, family="wan2.2_moe", component="transformer", **kw):
    return account(map_to_model(read_lora(path), family, family_by_id(family)), model, component=component, **kw)


def test_native_lightx2v_file_applies_every_tensor(tmp_path, wan22_expert):
    sd = wan_native_lora()
    acc = _account(save(sd, tmp_path / "native.safetensors"), wan22_expert)
    assert acc.counts == {"applied": len(sd), "expected_unmatched": 0, "unmatched": 0}
    assert acc.warnings == [] and acc.format == "lightx2v-native" and acc.dtype == "float32"
    assert (acc.rank, acc.ranks, acc.alpha, acc.scale) == (4, {4}, None, None)  # alpha only on some layers

    def key(name):
        return sd[f"diffusion_model.{name}"]

    q = acc.applied["blocks.0.attn1.to_q"]
    assert torch.equal(q.low_rank.down, key("blocks.0.self_attn.q.lora_down.weight"))
    assert (q.low_rank.alpha, q.low_rank.scale) == (8.0, 8.0 / 4)
    assert torch.equal(q.param_diffs["bias"], key("blocks.0.self_attn.q.diff_b"))
    assert torch.equal(q.param_diffs["weight"], key("blocks.0.self_attn.q.diff"))  # next to its low-rank pair
    assert torch.equal(acc.applied["blocks.1.attn2.to_out.0"].low_rank.up, key("blocks.1.cross_attn.o.lora_up.weight"))
    assert torch.equal(acc.applied["blocks.0.ffn.net.0.proj"].low_rank.up, key("blocks.0.ffn.0.lora_up.weight"))
    assert torch.equal(acc.applied["blocks.1.ffn.net.2"].param_diffs["bias"], key("blocks.1.ffn.2.diff_b"))
    # norms: q/k norm diffs, and native norm3 (affine cross-attn norm) = diffusers norm2
    assert torch.equal(acc.applied["blocks.0.attn2.norm_k"].param_diffs["weight"],
                       key("blocks.0.cross_attn.norm_k.diff"))
    assert torch.equal(acc.applied["blocks.1.norm2"].param_diffs["weight"], key("blocks.1.norm3.diff"))
    assert torch.equal(acc.applied["blocks.1.norm2"].param_diffs["bias"], key("blocks.1.norm3.diff_b"))
    # diff_m: blocks.N.modulation -> parameter scale_shift_table of module blocks.N; head.modulation -> root's
    assert torch.equal(acc.applied["blocks.1"].param_diffs["scale_shift_table"], key("blocks.1.diff_m"))
    assert torch.equal(acc.applied[""].param_diffs["scale_shift_table"], key("head.diff_m"))
    # alpha on a non-block layer (diffusers rejects the whole file for it) and alpha-free globals
    assert acc.applied["proj_out"].low_rank.scale == 8.0 / 4
    assert torch.equal(acc.applied["proj_out"].param_diffs["bias"], key("head.head.diff_b"))
    text = acc.applied["condition_embedder.text_embedder.linear_1"].low_rank
    assert (text.alpha, text.scale) == (None, 1.0)
    assert torch.equal(text.up, key("text_embedding.0.lora_up.weight"))
    assert torch.equal(acc.applied["condition_embedder.time_proj"].low_rank.down,
                       key("time_projection.1.lora_down.weight"))
    # Conv3d low-rank: up [out, r, 1, 1, 1] @ down [r, in, 1, 2, 2] has the conv weight's shape
    conv = acc.applied["patch_embedding"].low_rank
    product = (conv.up.flatten(1) @ conv.down.flatten(1)).reshape(conv.up.shape[0], *conv.down.shape[1:])
    assert product.shape == wan22_expert.patch_embedding.weight.shape
    json.dumps(acc.to_dict())


def _variants(sd):
    native = "diffusion_model."
    return {
        "lora_A/B": rename(sd, suffixes={".lora_down.weight": ".lora_A.weight", ".lora_up.weight": ".lora_B.weight"}),
        "lora.down/up": rename(sd, suffixes={".lora_down.weight": ".lora.down.weight",
                                             ".lora_up.weight": ".lora.up.weight"}),
        "default": rename(sd, prefix_from=native, prefix_to="transformer.",
                          suffixes={".lora_down.weight": ".lora_A.default.weight",
                                    ".lora_up.weight": ".lora_B.default.weight"}),
        "model.diffusion_model": rename(sd, prefix_from=native, prefix_to="model.diffusion_model."),
        "no prefix": rename(sd, prefix_from=native),
        "kohya": rename(sd, prefix_from=native, prefix_to="lora_unet_", flatten=True),
        # issue #13: Wan Fun's doubled underscore, and DiffSynth/kijai's pipe.dit. with PEFT's .default names
        "wan fun lora_unet__": rename(sd, prefix_from=native, prefix_to="lora_unet__", flatten=True),
        "diffsynth pipe.dit": rename(sd, prefix_from=native, prefix_to="pipe.dit.",
                                     suffixes={".lora_down.weight": ".lora_A.default.weight",
                                               ".lora_up.weight": ".lora_B.default.weight"}),
        "kijai modulation.diff": rename(sd, suffixes={".diff_m": ".modulation.diff"}),
    }


@pytest.mark.parametrize("layout", list(_variants({})))
def test_every_layout_gives_the_same_patches(tmp_path, wan22_expert, layout):
    sd = wan_native_lora(seed=3)
    reference = _account(save(sd, tmp_path / "native.safetensors"), wan22_expert)
    variant = _variants(sd)[layout]
    acc = _account(save(variant, tmp_path / "variant.safetensors"), wan22_expert)
    assert acc.counts == {"applied": len(variant), "expected_unmatched": 0, "unmatched": 0}
    expected, got = effective_deltas(reference.applied), effective_deltas(acc.applied)
    assert got.keys() == expected.keys()
    for where, delta in expected.items():
        assert torch.equal(got[where], delta), where


def test_musubi_hybrid_dotted_kohya_names(tmp_path, wan22_expert):
    """kijai #869: ``lora_unet_blocks_22.self_attn.k`` (underscores up to the block, dots after)."""
    sd = {"lora_unet_blocks_1.self_attn.k.lora_down.weight": torch.randn(2, 24),
          "lora_unet_blocks_1.self_attn.k.lora_up.weight": torch.randn(24, 2),
          "lora_unet_blocks_1.self_attn.k.alpha": torch.tensor(1.0)}
    acc = _account(save(sd, tmp_path / "hybrid.safetensors"), wan22_expert)
    assert list(acc.applied) == ["blocks.1.attn1.to_k"] and acc.applied["blocks.1.attn1.to_k"].low_rank.scale == 0.5


def test_diffusers_named_lora_from_the_model_itself(tmp_path, wan22_expert):
    """diffusers/PEFT names pass through: a LoRA on every Linear/Conv of the model, named from named_modules()."""
    g = torch.Generator().manual_seed(5)
    sd = {}
    for name, module in wan22_expert.named_modules():
        if isinstance(module, (torch.nn.Linear, torch.nn.Conv3d)):
            weight = module.weight
            sd[f"transformer.{name}.lora_A.weight"] = torch.randn(3, *weight.shape[1:], generator=g)
            sd[f"transformer.{name}.lora_B.weight"] = torch.randn(weight.shape[0], 3, *([1] * (weight.dim() - 2)),
                                                                  generator=g)
    acc = _account(save(sd, tmp_path / "diffusers.safetensors"), wan22_expert)
    assert acc.counts == {"applied": len(sd), "expected_unmatched": 0, "unmatched": 0}
    modules = {k[len("transformer."):-len(".lora_A.weight")] for k in sd if k.endswith("lora_A.weight")}
    assert set(acc.applied) == modules
    assert acc.format == "diffusers" and acc.scale == 1.0


def test_i2v_keys_on_a_wan22_expert_are_expected_unmatched(tmp_path, wan22_expert, wan21_i2v):
    sd = wan_native_lora(i2v=True)
    path = save(sd, tmp_path / "wan2.1_i2v_lora_rank64_lightx2v_4step.safetensors")
    image_keys = {k for k in sd if any(f".{part}." in k for part in IMAGE_PARTS)}
    assert len(image_keys) > 0

    acc = _account(path, wan22_expert)
    assert set(acc.expected_unmatched) == image_keys
    assert set(acc.expected_unmatched.values()) == {wan_keymap.IMAGE_BRANCH_REASON}
    assert acc.counts == {"applied": len(sd) - len(image_keys), "expected_unmatched": len(image_keys), "unmatched": 0}
    assert any(f"{len(image_keys)} key(s) not applied" in w and "image branch" in w for w in acc.warnings)

    # the same file on a Wan2.1 I2V transformer (which has the image branch) applies everything
    acc_i2v = _account(path, wan21_i2v, family="wan2.1")
    assert acc_i2v.counts == {"applied": len(sd), "expected_unmatched": 0, "unmatched": 0}
    assert torch.equal(acc_i2v.applied["blocks.0.attn2.add_k_proj"].low_rank.up,
                       sd["diffusion_model.blocks.0.cross_attn.k_img.lora_up.weight"])
    assert torch.equal(acc_i2v.applied["blocks.1.attn2.norm_added_k"].param_diffs["weight"],
                       sd["diffusion_model.blocks.1.cross_attn.norm_k_img.diff"])
    assert torch.equal(acc_i2v.applied["condition_embedder.image_embedder.ff.net.2"].low_rank.down,
                       sd["diffusion_model.img_emb.proj.3.lora_down.weight"])
    assert torch.equal(acc_i2v.applied["condition_embedder.image_embedder.norm1"].param_diffs["bias"],
                       sd["diffusion_model.img_emb.proj.0.diff_b"])


def _with_unknown_keys(count):
    sd = wan_native_lora()
    for i in range(count):
        sd[f"diffusion_model.extra_blocks.{i}.before_proj.lora_down.weight"] = torch.randn(4, 24)
        sd[f"diffusion_model.extra_blocks.{i}.before_proj.lora_up.weight"] = torch.randn(24, 4)
    return sd


def test_unknown_keys_raise_with_first_keys_and_count(tmp_path, wan22_expert):
    sd = _with_unknown_keys(6)
    with pytest.raises(KeyMatchError) as error:
        _account(save(sd, tmp_path / "unknown.safetensors"), wan22_expert)
    message = str(error.value)
    assert message.startswith("unknown.safetensors: 12 key(s) match nothing in the transformer (wan2.2_moe): ")
    assert "diffusion_model.extra_blocks.0.before_proj.lora_down.weight" in message and "and 4 more" in message


def test_lenient_turns_unknown_keys_into_a_warning(tmp_path, wan22_expert):
    sd = _with_unknown_keys(2)
    acc = _account(save(sd, tmp_path / "unknown.safetensors"), wan22_expert, lenient=True, component="transformer_2")
    unknown = sorted(k for k in sd if "extra_blocks" in k)
    assert sorted(acc.unmatched) == unknown
    assert acc.counts == {"applied": len(sd) - len(unknown), "expected_unmatched": 0, "unmatched": len(unknown)}
    assert acc.warnings == [f"unknown.safetensors: {len(unknown)} key(s) match nothing in the transformer_2 "
                            f"(wan2.2_moe) and are ignored: {', '.join(acc.unmatched)}"]
    assert acc.to_dict()["unmatched"] == acc.unmatched and acc.to_dict()["component"] == "transformer_2"


def test_shape_mismatch_always_raises_with_key_expected_and_got(tmp_path, wan22_expert):
    sd = wan_native_lora()
    sd["diffusion_model.blocks.0.ffn.0.lora_up.weight"] = torch.randn(40, 4)  # model's ffn is 32 wide
    with pytest.raises(KeyMatchError, match=r"bad\.safetensors: 'diffusion_model\.blocks\.0\.ffn\.0\.lora_down"
                                            r"\.weight' and 'diffusion_model\.blocks\.0\.ffn\.0\.lora_up\.weight' "
                                            r"do not fit transformer \(wan2\.2_moe\) parameter "
                                            r"blocks\.0\.ffn\.net\.0\.proj\.weight: expected shape \(32, 24\), "
                                            r"got \(40, 24\)"):
        _account(save(sd, tmp_path / "bad.safetensors"), wan22_expert, lenient=True)
    sd = wan_native_lora()
    sd["diffusion_model.blocks.1.diff_m"] = torch.randn(1, 6, 23)
    with pytest.raises(KeyMatchError, match=r"'diffusion_model\.blocks\.1\.diff_m' does not fit .* "
                                            r"blocks\.1\.scale_shift_table: expected shape \(1, 6, 24\), "
                                            r"got \(1, 6, 23\)"):
        _account(save(sd, tmp_path / "bad_m.safetensors"), wan22_expert, lenient=True)


def test_one_module_named_twice_is_refused(tmp_path):
    sd = {"diffusion_model.blocks.0.self_attn.q.lora_down.weight": torch.randn(2, 24),
          "diffusion_model.blocks.0.self_attn.q.lora_up.weight": torch.randn(24, 2),
          "blocks.0.attn1.to_q.lora_A.weight": torch.randn(2, 24),
          "blocks.0.attn1.to_q.lora_B.weight": torch.randn(24, 2)}
    with pytest.raises(KeyMatchError, match=r"twice\.safetensors: keys .* both target 'blocks\.0\.attn1\.to_q'"):
        map_to_model(read_lora(save(sd, tmp_path / "twice.safetensors")), "wan2.1", family_by_id("wan2.1"))


def test_recognizes_wan_names_without_a_model(tmp_path):
    lora = read_lora(save(wan_native_lora(num_blocks=1), tmp_path / "w.safetensors"))
    assert wan_keymap.recognizes(lora) and families.guess_family(lora) is wan.FAMILY
    kohya = read_lora(save(rename(wan_native_lora(num_blocks=1), prefix_from="diffusion_model.", prefix_to="lora_unet_",
                                  flatten=True), tmp_path / "k.safetensors"))
    assert families.guess_family(kohya) is wan.FAMILY


def test_modules_wrapped_by_a_peft_adapter_still_account(tmp_path, wan22_expert):
    """A dynamic adapter injected into the same model moves weights to ``<module>.base_layer``."""
    import copy

    from peft import LoraConfig, inject_adapter_in_model

    model = copy.deepcopy(wan22_expert)
    inject_adapter_in_model(LoraConfig(r=2, target_modules=["to_q", "to_out.0", "ffn.net.2"]), model, "dyn")
    assert hasattr(dict(model.named_modules())["blocks.0.attn1.to_q"], "base_layer")
    sd = wan_native_lora()
    acc = _account(save(sd, tmp_path / "native.safetensors"), model)
    assert acc.counts == {"applied": len(sd), "expected_unmatched": 0, "unmatched": 0}
    assert torch.equal(acc.applied["blocks.0.attn1.to_q"].param_diffs["bias"],
                       sd["diffusion_model.blocks.0.self_attn.q.diff_b"])


def test_diffusers_named_diff_on_a_non_weight_parameter_targets_that_parameter(tmp_path, wan22_expert):
    """``<module>.<param>.diff`` (what ``lorabind extract`` writes for e.g. a changed modulation table) names a
    parameter, not a module: it applies as a diff of that parameter."""
    table = torch.randn(wan22_expert.blocks[0].scale_shift_table.shape)
    bias = torch.randn(wan22_expert.blocks[0].attn1.to_q.bias.shape)
    sd = {"transformer.blocks.0.scale_shift_table.diff": table, "transformer.blocks.0.attn1.to_q.diff_b": bias,
          "transformer.scale_shift_table.diff": torch.randn(wan22_expert.scale_shift_table.shape)}
    acc = _account(save(sd, tmp_path / "extracted.safetensors"), wan22_expert)
    assert acc.counts == {"applied": 3, "expected_unmatched": 0, "unmatched": 0}
    assert torch.equal(acc.applied["blocks.0"].param_diffs["scale_shift_table"], table)
    assert torch.equal(acc.applied["blocks.0.attn1.to_q"].param_diffs["bias"], bias)
    assert set(acc.applied[""].param_diffs) == {"scale_shift_table"}


def test_a_qwen_image_lora_on_wan_is_another_familys_not_an_image_branch(tmp_path, wan22_expert):
    """Qwen-Image's text-stream projections are called ``attn.add_k_proj`` / ``add_v_proj`` too: on a Wan model
    every key of the file is another family's (refused saying so), none is explained as Wan2.1's image branch."""
    sd = {key: value for key, value in qwen_lora(num_blocks=1).items()  # blocks only, as the Lightning files
          if key.startswith("transformer_blocks.")}
    path = save(sd, tmp_path / "Qwen-Image-Lightning-4steps-V1.0.safetensors")
    with pytest.raises(KeyMatchError) as refused:
        _account(path, wan22_expert, guess_family=families.guess_family)
    message = str(refused.value)
    assert f"{len(sd)} key(s) match nothing" in message and "image branch" not in message
    assert ("They are another model family's keys: the file's module names look like a qwen_image LoRA, not one "
            "for this wan2.2_moe model.") in message
    lenient = _account(path, wan22_expert, lenient=True, guess_family=families.guess_family)
    assert lenient.expected_unmatched == {} and len(lenient.unmatched) == len(sd)
