"""Qwen-Image LoRAs (Lightning, kohya, diffusers with embedded config, PEFT folders) onto the tiny Qwen model."""

import copy
import json
import math

import pytest
import torch

from formats_helpers import effective_deltas, qwen_lora, rename, save, wan_native_lora
from lorabind.loaders import families
from lorabind.loaders.errors import KeyMatchError, LoraFileError
from lorabind.loaders.families import family_by_id, qwen_image
from lorabind.loaders.families.qwen_image import keymap as qwen_keymap
from lorabind.loaders.families.wan import keymap as wan_keymap
from lorabind.loaders.lora import account, map_to_model, read_lora


def _account(path, model, **kw):
    return account(map_to_model(read_lora(path), "qwen_image", family_by_id("qwen_image")), model,
                   component="transformer", guess_family=families.guess_family, **kw)


def test_lightning_style_file_applies_every_tensor(tmp_path, qwen_transformer):
    sd = qwen_lora(alpha=8.0)
    acc = _account(save(sd, tmp_path / "Qwen-Image-Lightning-4steps-V1.0.safetensors"), qwen_transformer)
    assert acc.counts == {"applied": len(sd), "expected_unmatched": 0, "unmatched": 0}
    assert (acc.rank, acc.alpha, acc.scale) == (4, 8.0, 8.0 / 4)
    top = acc.applied["time_text_embed.timestep_embedder.linear_1"].low_rank
    assert torch.equal(top.down, sd["time_text_embed.timestep_embedder.linear_1.lora_down.weight"])
    assert torch.equal(acc.applied["transformer_blocks.1.txt_mod.1"].low_rank.up,
                       sd["transformer_blocks.1.txt_mod.1.lora_up.weight"])
    modules = dict(qwen_transformer.named_modules())
    linears = {n for n, m in modules.items() if isinstance(m, torch.nn.Linear)}
    assert set(acc.applied) == linears  # the generator covers every Linear of the transformer


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["diffusion_model", "kohya", "lora_A/B", "no alpha"])
def test_layouts_give_the_same_patches(tmp_path, qwen_transformer, layout):
    sd = qwen_lora(alpha=4.0, seed=7)
    reference = _account(save(sd, tmp_path / "ref.safetensors"), qwen_transformer)
    variant = {
        "diffusion_model": rename(sd, prefix_to="diffusion_model."),
        "kohya": rename(sd, prefix_to="lora_unet_", flatten=True),
        "lora_A/B": rename(sd, prefix_to="transformer.",
                           suffixes={".lora_down.weight": ".lora_A.weight", ".lora_up.weight": ".lora_B.weight"}),
        "no alpha": {k: v for k, v in sd.items() if not k.endswith(".alpha")},
    }[layout]
    acc = _account(save(variant, tmp_path / "variant.safetensors"), qwen_transformer)
    assert acc.counts == {"applied": len(variant), "expected_unmatched": 0, "unmatched": 0}
    # alpha 4 at rank 4 is scale 1: dropping alpha must not change anything either
    expected, got = effective_deltas(reference.applied), effective_deltas(acc.applied)
    assert got.keys() == expected.keys()
    for where, delta in expected.items():
        assert torch.equal(got[where], delta), where


def test_kohya_top_level_names_are_redotted(tmp_path, qwen_transformer):
    sd = rename(qwen_lora(num_blocks=1, alpha=2.0), prefix_to="lora_unet_", flatten=True)
    lora = read_lora(save(sd, tmp_path / "kohya.safetensors"))
    assert lora.format == "kohya"
    assert "norm_out_linear" in lora.targets and "time_text_embed_timestep_embedder_linear_2" in lora.targets
    mapped = map_to_model(lora, "qwen_image", family_by_id("qwen_image"))
    assert {"norm_out.linear", "time_text_embed.timestep_embedder.linear_2", "transformer_blocks.0.attn.to_out.0",
            "transformer_blocks.0.attn.to_add_out", "transformer_blocks.0.img_mlp.net.0.proj"} <= set(mapped.targets)


def _inject_peft(transformer, config):
    from peft import inject_adapter_in_model
    from peft.utils import get_peft_model_state_dict

    model = copy.deepcopy(transformer)
    inject_adapter_in_model(config, model, adapter_name="default")
    g = torch.Generator().manual_seed(11)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:  # PEFT initialises B to zero; make the delta visible
                param.copy_(torch.randn(param.shape, generator=g) * 0.1)
    return model, get_peft_model_state_dict(model, adapter_name="default")


def _write_peft_folder(folder, config, state_dict):
    folder.mkdir()
    config.save_pretrained(str(folder))
    save({f"base_model.model.{k}": v for k, v in state_dict.items()}, folder / "adapter_model.safetensors")
    return str(folder)


@pytest.mark.filterwarnings("ignore:.*invalid shape.*lora_B.bias")  # peft 0.21's false positive on lora_bias
@pytest.mark.parametrize("use_rslora", [False, True])
def test_peft_folder_scales_match_peft_itself(tmp_path, qwen_transformer, use_rslora):
    from peft import LoraConfig

    config = LoraConfig(r=4, lora_alpha=16, target_modules=["to_q", "to_k", "to_out.0", "img_mlp.net.2"],
                        rank_pattern={"to_k": 2}, alpha_pattern={"img_mlp.net.2": 3}, use_rslora=use_rslora,
                        lora_bias=True)
    peft_model, state_dict = _inject_peft(qwen_transformer, config)
    folder = _write_peft_folder(tmp_path / "peft_adapter", config, state_dict)

    acc = _account(folder, qwen_transformer)
    assert acc.format == "peft-folder" and acc.file == "peft_adapter"
    assert acc.counts == {"applied": len(state_dict), "expected_unmatched": 0, "unmatched": 0}
    assert acc.ranks == {2, 4} and acc.rank is None
    peft_modules = dict(peft_model.named_modules())
    for module, patch in acc.applied.items():
        layer = peft_modules[module]
        assert patch.low_rank.scale == pytest.approx(layer.scaling["default"]), module
        assert torch.equal(patch.low_rank.down, layer.lora_A["default"].weight)
        # peft's merge adds lora_B.bias * scaling (issue #13: it was added unscaled)
        assert torch.equal(patch.param_diffs["bias"], layer.lora_B["default"].bias * layer.scaling["default"])
    # and against the formula: alpha/r (rsLoRA: alpha/sqrt(r)) with the per-module patterns
    root = math.sqrt if use_rslora else (lambda r: r)
    assert acc.applied["transformer_blocks.0.attn.to_q"].low_rank.scale == pytest.approx(16 / root(4))
    assert acc.applied["transformer_blocks.1.attn.to_k"].low_rank.scale == pytest.approx(16 / root(2))
    assert acc.applied["transformer_blocks.0.img_mlp.net.2"].low_rank.scale == pytest.approx(3 / root(4))


def test_peft_folder_rank_disagreeing_with_config_is_refused(tmp_path, qwen_transformer):
    from peft import LoraConfig

    config = LoraConfig(r=4, lora_alpha=8, target_modules=["to_q"])
    _, state_dict = _inject_peft(qwen_transformer, config)
    folder = tmp_path / "lying"
    _write_peft_folder(folder, config, state_dict)
    (folder / "adapter_config.json").write_text(json.dumps({**json.loads((folder / "adapter_config.json").read_text()),
                                                            "r": 8}))
    with pytest.raises(LoraFileError, match=r"lying: adapter config gives module 'transformer_blocks\.0\.attn\.to_q' "
                                        r"rank 8 but .* has rank 4"):
        read_lora(str(folder))


def test_diffusers_file_with_embedded_lora_config(tmp_path, qwen_transformer):
    """``QwenImagePipeline.save_lora_weights`` stores the LoraConfig in metadata as ``transformer.lora_alpha``..."""
    from diffusers import QwenImagePipeline
    from peft import LoraConfig

    config = LoraConfig(r=4, lora_alpha=12, target_modules=["to_q", "to_v"])
    _, state_dict = _inject_peft(qwen_transformer, config)
    QwenImagePipeline.save_lora_weights(str(tmp_path / "saved"), transformer_lora_layers=state_dict,
                                        transformer_lora_adapter_metadata=config.to_dict())
    path = str(tmp_path / "saved" / "pytorch_lora_weights.safetensors")
    acc = _account(path, qwen_transformer)
    assert acc.format == "diffusers"
    assert acc.counts["applied"] == len(state_dict) and acc.scale == 12 / 4


def test_unknown_qwen_keys_and_shape_errors(tmp_path, qwen_transformer):
    sd = qwen_lora(num_blocks=1)
    sd["transformer_blocks.0.attn.to_qkv.lora_down.weight"] = torch.randn(4, 48)
    sd["transformer_blocks.0.attn.to_qkv.lora_up.weight"] = torch.randn(144, 4)
    with pytest.raises(KeyMatchError, match=r"fused\.safetensors: 2 key\(s\) match nothing in the transformer "
                                            r"\(qwen_image\): transformer_blocks\.0\.attn\.to_qkv\.lora_down\.weight"):
        _account(save(sd, tmp_path / "fused.safetensors"), qwen_transformer)
    sd = qwen_lora(num_blocks=1)
    sd["img_in.lora_down.weight"] = torch.randn(4, 64)
    with pytest.raises(KeyMatchError, match=r"expected shape \(48, 16\), got \(48, 64\)"):
        _account(save(sd, tmp_path / "wide.safetensors"), qwen_transformer, lenient=True)


def test_text_encoder_keys_are_expected_unmatched(tmp_path, qwen_transformer):
    sd = qwen_lora(num_blocks=1)
    te = {"lora_te_text_model_encoder_layers_0_mlp_fc1.lora_down.weight": torch.randn(4, 16),
          "lora_te_text_model_encoder_layers_0_mlp_fc1.lora_up.weight": torch.randn(16, 4)}
    acc = _account(save({**rename(sd, prefix_to="lora_unet_", flatten=True), **te}, tmp_path / "te.safetensors"),
                   qwen_transformer)
    assert set(acc.expected_unmatched) == set(te) and "text-encoder" in next(iter(acc.expected_unmatched.values()))
    assert acc.counts == {"applied": len(sd), "expected_unmatched": 2, "unmatched": 0}


def test_a_wan_lora_on_qwen_names_the_family_it_looks_like(tmp_path, qwen_transformer):
    sd = wan_native_lora(num_blocks=1)
    with pytest.raises(KeyMatchError, match=rf"wan\.safetensors: {len(sd)} key\(s\) match nothing in the "
                                            r"transformer \(qwen_image\): .* They are another model family's "
                                            r"keys: the file's module names look like a wan2\.1/wan2\.2_moe LoRA, "
                                            r"not one for this qwen_image model\."):
        _account(save(sd, tmp_path / "wan.safetensors"), qwen_transformer)


def test_recognizes_only_qwen_specific_names(tmp_path):
    qwen = read_lora(save(qwen_lora(num_blocks=1), tmp_path / "q.safetensors"))
    assert qwen_keymap.recognizes(qwen) and not wan_keymap.recognizes(qwen) and families.guess_family(qwen) is qwen_image.FAMILY
    # MiniMax-H3's diffusers layout also has transformer_blocks.N.attn.to_q, but no Qwen-only part
    h3_like = {f"transformer_blocks.0.{m}.lora_A.default.weight": torch.randn(2, 8) for m in ("attn.to_q", "ff.net.2")}
    h3_like.update({k.replace("lora_A", "lora_B"): torch.randn(8, 2) for k in h3_like})
    h3 = read_lora(save(h3_like, tmp_path / "h3.safetensors"))
    assert not qwen_keymap.recognizes(h3) and not wan_keymap.recognizes(h3)


def test_adapter_model_file_inside_a_peft_folder_keeps_its_config(tmp_path, qwen_transformer):
    from peft import LoraConfig

    config = LoraConfig(r=4, lora_alpha=10, target_modules=["to_v"])
    _, state_dict = _inject_peft(qwen_transformer, config)
    folder = _write_peft_folder(tmp_path / "pointed_at_file", config, state_dict)
    lora = read_lora(f"{folder}/adapter_model.safetensors")
    assert lora.format == "peft-folder" and lora.name == "pointed_at_file"
    assert {patch.low_rank.scale for patch in lora.targets.values()} == {10 / 4}
    assert lora.metadata["adapter_config"]["lora_alpha"] == 10
