"""LoRA files found hostile or mis-read by issue #13: duplicate header keys, non-finite tensors, ``.sft``, PEFT
patterns with pathological regexes, PEFT ``lora_bias`` scaling (checked against peft's own merge)."""

from __future__ import annotations

import json
import struct

import pytest
import torch
from safetensors.torch import save_file

from lorabind.loaders.binding.patching import PatchLayer, WeightPatcher
from lorabind.loaders.errors import LoraBindError, LoraFileError
from lorabind.loaders.lora import clear_lora_cache, read_lora


@pytest.fixture(autouse=True)
def _fresh_cache():
    clear_lora_cache()
    yield
    clear_lora_cache()


def _pair(rank=2, width=8, scale=0.1):
    return {"blocks.0.attn1.to_q.lora_A.weight": torch.randn(rank, width) * scale,
            "blocks.0.attn1.to_q.lora_B.weight": torch.randn(width, rank) * scale}


def _save(sd, path, metadata=None):
    save_file(sd, str(path), metadata=metadata)
    return str(path)


def test_a_header_listing_a_key_twice_is_refused(tmp_path):
    entry = {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}
    header = ('{"a.alpha": %s, "a.alpha": %s}' % (json.dumps(entry), json.dumps(entry))).encode()
    path = tmp_path / "dup.safetensors"
    path.write_bytes(struct.pack("<Q", len(header)) + header + struct.pack("<f", 1.0))
    with pytest.raises(LoraFileError, match=r"dup.safetensors: safetensors header lists 'a.alpha' twice"):
        read_lora(str(path))


def test_a_deeply_nested_header_or_adapter_config_is_a_clear_refusal(tmp_path):
    header = b"[" * 100_000
    path = tmp_path / "deep.safetensors"
    path.write_bytes(struct.pack("<Q", len(header)) + header)
    with pytest.raises(LoraFileError, match=r"deep.safetensors: safetensors header nests deeper than the format's 3"):
        read_lora(str(path))
    folder = tmp_path / "peft"
    folder.mkdir()
    _save(_pair(), folder / "adapter_model.safetensors")
    (folder / "adapter_config.json").write_text("[" * 100_000)
    with pytest.raises(LoraFileError, match=r"peft: cannot read adapter_config.json \(JSON nested more than"):
        read_lora(str(folder))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_non_finite_tensors_are_refused_naming_the_tensor(tmp_path, bad, dtype):
    sd = {k: v.to(dtype) for k, v in _pair().items()}
    sd["blocks.0.attn1.to_q.lora_B.weight"][3, 1] = bad
    with pytest.raises(LoraFileError, match=r"nan.safetensors: tensor 'blocks.0.attn1.to_q.lora_B.weight' holds "
                                            r"NaN or infinite values"):
        read_lora(_save(sd, tmp_path / "nan.safetensors"))


def test_a_fuse_overflowing_bf16_is_refused_and_the_weight_is_untouched(tmp_path):
    sd = {k: v.to(torch.bfloat16) for k, v in _pair().items()}
    sd["blocks.0.attn1.to_q.lora_A.weight"].fill_(1e19)
    sd["blocks.0.attn1.to_q.lora_B.weight"].fill_(1e19)  # finite factors; up @ down = 2e38, x4 overflows bf16
    lora = read_lora(_save(sd, tmp_path / "big.safetensors"))
    block = torch.nn.Module()
    block.to_q = torch.nn.Linear(8, 8).to(torch.bfloat16)
    root = torch.nn.Module()
    root.blocks = torch.nn.ModuleList([torch.nn.Module()])
    root.blocks[0].attn1 = block
    before = block.to_q.weight.detach().clone()
    patcher = WeightPatcher({"transformer": root})
    layer = PatchLayer(key="big", component="transformer", strength=4.0, name="big.safetensors",
                       targets={"blocks.0.attn1.to_q": lora.targets["blocks.0.attn1.to_q"]})
    with pytest.raises(LoraBindError, match=r"transformer:blocks.0.attn1.to_q.weight: the fused value is not finite "
                                            r"in bfloat16"):
        patcher.apply([layer])
    assert torch.equal(block.to_q.weight, before) and patcher.patched == set()


def test_sft_files_are_read_like_safetensors(tmp_path):
    sd = _pair()
    lora = read_lora(_save(sd, tmp_path / "short.sft"))
    assert torch.equal(lora.targets["blocks.0.attn1.to_q"].low_rank.down, sd["blocks.0.attn1.to_q.lora_A.weight"])


def _peft_folder(tmp_path, config: dict, sd: dict):
    folder = tmp_path / "adapter"
    folder.mkdir()
    _save({f"base_model.model.{k}": v for k, v in sd.items()}, folder / "adapter_model.safetensors")
    (folder / "adapter_config.json").write_text(json.dumps({"r": 2, "lora_alpha": 2, **config}))
    return str(folder)


def _modules(*names):
    sd = {}
    for name in names:
        sd.update({f"{name}.lora_A.weight": torch.randn(2, 8), f"{name}.lora_B.weight": torch.randn(8, 2)})
    return sd


def test_nested_repetition_patterns_match_in_bounded_time(tmp_path):
    name = "blocks.0." + "x" * 26  # Python's re needs ~12 s for this one match
    folder = _peft_folder(tmp_path, {"rank_pattern": {"(x+x+)+y": 4}}, _modules(name))
    # Within the matching budget (a 12 s match would have been refused), so no wall-clock assertion: on a
    # loaded machine that measures the machine, and timing goals belong in bench/.
    assert read_lora(folder).targets[name].low_rank.scale == 1.0  # no match: r=2, lora_alpha=2


@pytest.mark.slow
def test_a_pattern_too_costly_to_match_is_refused_naming_it(tmp_path):
    folder = _peft_folder(tmp_path, {"alpha_pattern": {"(a|aa)+b": 4}}, _modules("blocks.0." + "a" * 34))
    with pytest.raises(LoraFileError, match=r"adapter: adapter config pattern '\(a\|aa\)\+b' takes too long"):
        read_lora(folder)


def test_rank_and_alpha_patterns_match_like_peft(tmp_path):
    from peft.utils.other import get_pattern_key

    modules = ["blocks.0.attn1.to_q", "blocks.1.attn1.to_q", "blocks.0.attn2.to_q"]
    patterns = {"blocks.1.attn1.to_q": 16.0, r"attn2\.to_q": 8.0, "to_k": 1.0}
    lora = read_lora(_peft_folder(tmp_path, {"alpha_pattern": patterns}, _modules(*modules)))
    for module in modules:
        key = get_pattern_key(list(patterns), module)
        expected = patterns.get(key, 2.0) / 2
        assert lora.targets[module].low_rank.scale == expected, module


@pytest.mark.parametrize("lora_alpha", [4, 8])  # scaling 2 and 4
def test_peft_lora_bias_is_scaled_as_peft_merges_it(tmp_path, lora_alpha):
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(0)
    base = torch.nn.Sequential()
    base.add_module("proj", torch.nn.Linear(8, 6))
    config = LoraConfig(r=2, lora_alpha=lora_alpha, target_modules=["proj"], lora_bias=True,
                        init_lora_weights=False)
    model = get_peft_model(base, config)
    model.save_pretrained(str(tmp_path / "adapter"), safe_serialization=True)
    weight_before = model.base_model.model.proj.base_layer.weight.detach().clone()
    bias_before = model.base_model.model.proj.base_layer.bias.detach().clone()
    merged = model.merge_and_unload()
    lora = read_lora(str(tmp_path / "adapter"))
    patch = lora.targets["proj"]
    torch.testing.assert_close(patch.param_diffs["bias"], merged.proj.bias.detach() - bias_before)
    delta = patch.low_rank.scale * patch.low_rank.up @ patch.low_rank.down
    torch.testing.assert_close(delta, merged.proj.weight.detach() - weight_before)
