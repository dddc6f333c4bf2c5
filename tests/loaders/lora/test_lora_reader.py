"""Reading: safetensors header validation, pickle refusal, key grammar, pairing errors, cache."""

import json
import os
import struct

import pytest
import torch

from formats_helpers import save
from lorabind.loaders.errors import LoraFileError
from lorabind.loaders.lora import read_lora


def _raw_header(path):
    with open(path, "rb") as handle:
        (length,) = struct.unpack("<Q", handle.read(8))
        header = json.loads(handle.read(length))
        data = handle.read()
    return header, data


def _write_raw(path, header, data):
    encoded = json.dumps(header).encode()
    with open(path, "wb") as handle:
        handle.write(struct.pack("<Q", len(encoded)) + encoded + data)
    return str(path)


def _to_q_pair(rank=2):
    return {"blocks.0.attn1.to_q.lora_A.weight": torch.randn(rank, 24),
            "blocks.0.attn1.to_q.lora_B.weight": torch.randn(24, rank)}


@pytest.fixture
def small_lora(tmp_path):
    sd = {"diffusion_model.blocks.0.self_attn.q.lora_down.weight": torch.randn(2, 24),
          "diffusion_model.blocks.0.self_attn.q.lora_up.weight": torch.randn(24, 2),
          "diffusion_model.blocks.0.self_attn.q.alpha": torch.tensor(4.0)}
    return save(sd, tmp_path / "small.safetensors", metadata={"note": "kept"}), sd


def test_reads_pairs_alpha_and_metadata(small_lora):
    path, sd = small_lora
    lora = read_lora(path)
    patch = lora.targets["blocks.0.self_attn.q"]
    assert torch.equal(patch.low_rank.down, sd["diffusion_model.blocks.0.self_attn.q.lora_down.weight"])
    assert torch.equal(patch.low_rank.up, sd["diffusion_model.blocks.0.self_attn.q.lora_up.weight"])
    assert (patch.low_rank.alpha, patch.low_rank.scale, patch.low_rank.rank) == (4.0, 4.0 / 2, 2)
    assert sorted(patch.all_source_keys()) == sorted(sd)
    assert patch.source_keys["down"] == ("diffusion_model.blocks.0.self_attn.q.lora_down.weight",)
    assert patch.source_keys["up"] == ("diffusion_model.blocks.0.self_attn.q.lora_up.weight",)
    assert lora.metadata == {"note": "kept"}
    assert (lora.name, lora.format, lora.dtype) == ("small.safetensors", "lightx2v-native", "float32")
    stat = os.stat(path)
    assert lora.identity == ((stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns),)


def test_truncated_file_is_refused_by_name(small_lora, tmp_path):
    path, _ = small_lora
    blob = open(path, "rb").read()
    cut = tmp_path / "cut.safetensors"
    cut.write_bytes(blob[:-10])
    with pytest.raises(LoraFileError, match=r"cut\.safetensors: .*truncated"):
        read_lora(str(cut))
    tiny = tmp_path / "tiny.safetensors"
    tiny.write_bytes(blob[:5])
    with pytest.raises(LoraFileError, match=r"tiny\.safetensors: not a safetensors file"):
        read_lora(str(tiny))


def test_header_longer_than_file_is_refused(small_lora, tmp_path):
    path, _ = small_lora
    blob = open(path, "rb").read()
    bad = tmp_path / "long.safetensors"
    bad.write_bytes(struct.pack("<Q", len(blob) * 10) + blob[8:])
    with pytest.raises(LoraFileError, match=r"long\.safetensors: safetensors header claims"):
        read_lora(str(bad))


def test_lying_offsets_and_shapes_name_the_key(small_lora, tmp_path):
    path, _ = small_lora
    header, data = _raw_header(path)
    key = "diffusion_model.blocks.0.self_attn.q.lora_up.weight"

    overlapping = json.loads(json.dumps(header))
    begin, end = overlapping[key]["data_offsets"]
    overlapping[key]["data_offsets"] = [begin - 4, end - 4]
    with pytest.raises(LoraFileError, match=r"offsets\.safetensors: tensor .* (overlaps|gap)"):
        read_lora(_write_raw(tmp_path / "offsets.safetensors", overlapping, data))

    wrong_shape = json.loads(json.dumps(header))
    wrong_shape[key]["shape"] = [24, 3]
    with pytest.raises(LoraFileError, match=rf"shape\.safetensors: tensor '{key}' is declared F32 \[24, 3\]"):
        read_lora(_write_raw(tmp_path / "shape.safetensors", wrong_shape, data))

    beyond = json.loads(json.dumps(header))
    last = max(beyond.items(), key=lambda kv: kv[1]["data_offsets"][1] if kv[0] != "__metadata__" else -1)[0]
    b, e = beyond[last]["data_offsets"]
    beyond[last]["data_offsets"] = [b + 8, e + 8]
    with pytest.raises(LoraFileError, match=rf"beyond\.safetensors: tensor '{last}' ends at byte {e + 8}"):
        read_lora(_write_raw(tmp_path / "beyond.safetensors", beyond, data))


def test_integer_and_bool_tensors_are_refused(tmp_path):
    for dtype, code in ((torch.int64, "I64"), (torch.bool, "BOOL")):
        sd = {"blocks.0.attn1.to_q.lora_A.weight": torch.ones(2, 24, dtype=dtype),
              "blocks.0.attn1.to_q.lora_B.weight": torch.ones(24, 2)}
        path = save(sd, tmp_path / f"int_{code}.safetensors")
        with pytest.raises(LoraFileError, match=rf"int_{code}\.safetensors: tensor "
                                                rf"'blocks\.0\.attn1\.to_q\.lora_A\.weight' has dtype {code}"):
            read_lora(path)


def test_integer_alpha_scalar_is_a_number(tmp_path):
    sd = {**_to_q_pair(rank=4), "blocks.0.attn1.to_q.alpha": torch.tensor(8, dtype=torch.int64)}
    patch = read_lora(save(sd, tmp_path / "int_alpha.safetensors")).targets["blocks.0.attn1.to_q"]
    assert (patch.low_rank.alpha, patch.low_rank.scale) == (8.0, 2.0)


def test_header_that_is_not_json_is_refused(tmp_path):
    bad = tmp_path / "garbage.safetensors"
    bad.write_bytes(struct.pack("<Q", 4) + b"{{{{")  # refused by the header budget: its brackets do not match
    with pytest.raises(LoraFileError, match=r"garbage\.safetensors: .* \(or its brackets do not match\)"):
        read_lora(str(bad))
    bad.write_bytes(struct.pack("<Q", 5) + b'{"a"}')
    with pytest.raises(LoraFileError, match=r"garbage\.safetensors: safetensors header is not valid JSON"):
        read_lora(str(bad))


@pytest.mark.parametrize("suffix", [".pt", ".ckpt", ".bin", ".pth"])
def test_pickle_checkpoints_are_refused_with_conversion_hint(tmp_path, suffix):
    path = tmp_path / f"lora{suffix}"
    path.write_bytes(b"\x80\x04not really a pickle")
    with pytest.raises(LoraFileError, match=rf"lora\{suffix}: pickle checkpoints .* convert the file to \.safetensors"):
        read_lora(str(path))


def test_peft_folder_with_only_bin_weights_is_refused(tmp_path):
    folder = tmp_path / "my_adapter"
    folder.mkdir()
    (folder / "adapter_config.json").write_text(json.dumps({"r": 4, "lora_alpha": 4}))
    (folder / "adapter_model.bin").write_bytes(b"pickle")
    with pytest.raises(LoraFileError, match=r"my_adapter: the PEFT folder holds only adapter_model\.bin .* "
                                            r"Convert it to adapter_model\.safetensors"):
        read_lora(str(folder))


def test_non_safetensors_and_missing_files(tmp_path):
    other = tmp_path / "lora.gguf"
    other.write_bytes(b"GGUF")
    with pytest.raises(LoraFileError, match=r"lora\.gguf: not a \.safetensors file"):
        read_lora(str(other))
    with pytest.raises(LoraFileError, match=r"absent\.safetensors: LoRA not found"):
        read_lora(str(tmp_path / "absent.safetensors"))


def test_pair_errors_name_the_key(tmp_path):
    lonely = save({"diffusion_model.blocks.0.ffn.0.lora_down.weight": torch.randn(2, 24)},
                  tmp_path / "half.safetensors")
    with pytest.raises(LoraFileError, match=r"half\.safetensors: 'diffusion_model\.blocks\.0\.ffn\.0\.lora_down"
                                            r"\.weight' has no matching up factor"):
        read_lora(lonely)
    orphan = save({"diffusion_model.head.head.alpha": torch.tensor(8.0),
                   "diffusion_model.head.head.diff_b": torch.randn(64)}, tmp_path / "orphan.safetensors")
    with pytest.raises(LoraFileError, match=r"orphan\.safetensors: 'diffusion_model\.head\.head\.alpha' has no "
                                            r"lora_down/lora_up"):
        read_lora(orphan)
    twice = save({"blocks.0.ffn.0.lora_down.weight": torch.randn(2, 24),
                  "blocks.0.ffn.0.lora_A.weight": torch.randn(2, 24),
                  "blocks.0.ffn.0.lora_up.weight": torch.randn(32, 2)}, tmp_path / "twice.safetensors")
    with pytest.raises(LoraFileError,
                       match=r"twice\.safetensors: keys .* both give the down of module 'blocks\.0\.ffn\.0'"):
        read_lora(twice)
    unchained = save({"blocks.0.ffn.0.lora_down.weight": torch.randn(2, 24),
                      "blocks.0.ffn.0.lora_up.weight": torch.randn(32, 3)}, tmp_path / "unchained.safetensors")
    with pytest.raises(LoraFileError,
                       match=r"unchained\.safetensors: factors of module 'blocks\.0\.ffn\.0' do not chain"):
        read_lora(unchained)


def test_tensors_that_are_not_lora_tensors_are_listed(tmp_path):
    sd = {**_to_q_pair(), "blocks.0.attn1.to_q.oft_blocks": torch.randn(4, 6, 6),  # LyCORIS OFT: no kind for it
          "blocks.0.attn1.to_q.oft_diag": torch.randn(24)}
    with pytest.raises(LoraFileError, match=r"oft\.safetensors: 2 tensor\(s\) are not LoRA tensors: "
                                            r"blocks\.0\.attn1\.to_q\.(oft_blocks|oft_diag)"):
        read_lora(save(sd, tmp_path / "oft.safetensors"))


def test_a_model_file_picked_as_a_lora_is_called_a_model(tmp_path):
    """Issue 57: a denoiser file in the loras list got "N tensor(s) are not LoRA tensors" and all 37 suffixes."""
    sd = {f"blocks.{i}.{name}": torch.randn(4, 4) for i in range(3)
          for name in ("self_attn.q.weight", "norm3.weight", "ffn.0.bias")}
    with pytest.raises(LoraFileError) as refused:
        read_lora(save(sd, tmp_path / "wan2.1_t2v_14B_fp8_scaled.safetensors"))
    message = str(refused.value)
    assert message.startswith("wan2.1_t2v_14B_fp8_scaled.safetensors: this is a model, not a LoRA: none of its 9 "
                              "tensors is a LoRA tensor")
    assert "known suffixes" not in message and "UNETLoader" in message


def test_two_dora_magnitudes_on_one_module_are_refused(tmp_path):
    sd = {**_to_q_pair(), "blocks.0.attn1.to_q.lora_magnitude_vector": torch.randn(24),
          "blocks.0.attn1.to_q.dora_scale": torch.randn(24)}
    with pytest.raises(LoraFileError, match=r"dora\.safetensors: module 'blocks\.0\.attn1\.to_q' has both .*"
                                            r"one DoRA magnitude per module"):
        read_lora(save(sd, tmp_path / "dora.safetensors"))


@pytest.mark.parametrize("keys, module, expected_format", [
    (("lora_unet_blocks_0_self_attn_q.lora_down.weight", "lora_unet_blocks_0_self_attn_q.lora_up.weight"),
     "blocks_0_self_attn_q", "kohya"),
    (("base_model.model.blocks.0.attn1.to_q.lora_A.weight", "base_model.model.blocks.0.attn1.to_q.lora_B.weight"),
     "blocks.0.attn1.to_q", "peft"),
    (("transformer.blocks.0.attn1.to_q.lora_A.weight", "transformer.blocks.0.attn1.to_q.lora_B.weight"),
     "blocks.0.attn1.to_q", "diffusers"),
    (("transformer.blocks.0.attn1.to_q.lora_A.default.weight", "transformer.blocks.0.attn1.to_q.lora_B.default.weight"),
     "blocks.0.attn1.to_q", "diffusers"),
    (("model.diffusion_model.blocks.0.self_attn.q.lora.down.weight",
      "model.diffusion_model.blocks.0.self_attn.q.lora.up.weight"), "blocks.0.self_attn.q", "lightx2v-native"),
    (("blocks.0.attn1.to_k.lora_linear_layer.down.weight", "blocks.0.attn1.to_k.lora_linear_layer.up.weight"),
     "blocks.0.attn1.to_k", "lora-down-up"),
    (("blocks.0.ffn.net.2.lora_A", "blocks.0.ffn.net.2.lora_B"), "blocks.0.ffn.net.2", "lora-down-up"),
    (("lora_transformer_transformer_blocks_0_attn_to_q.lora_down.weight",
      "lora_transformer_transformer_blocks_0_attn_to_q.lora_up.weight"), "transformer_blocks_0_attn_to_q", "kohya"),
    (("transformer.blocks.0.attn1.processor.to_out_lora.down.weight",
      "transformer.blocks.0.attn1.processor.to_out_lora.up.weight"), "blocks.0.attn1.to_out.0", "lora-down-up"),
    # issue #13: the layout actually detected
    (("diffusion_model.blocks.0.self_attn.q.lora_A.weight", "diffusion_model.blocks.0.self_attn.q.lora_B.weight"),
     "blocks.0.self_attn.q", "comfyui"),
    (("blocks.0.self_attn.q.lora_A.default.weight", "blocks.0.self_attn.q.lora_B.default.weight"),
     "blocks.0.self_attn.q", "diffsynth"),
    (("pipe.dit.blocks.0.self_attn.q.lora_A.default.weight", "pipe.dit.blocks.0.self_attn.q.lora_B.default.weight"),
     "blocks.0.self_attn.q", "diffsynth"),
    (("lora_unet__blocks_0_cross_attn_k.lora_down.weight", "lora_unet__blocks_0_cross_attn_k.lora_up.weight"),
     "blocks_0_cross_attn_k", "kohya"),
])
def test_layouts_normalise_to_one_module_name(tmp_path, keys, module, expected_format):
    down, up = torch.randn(2, 24), torch.randn(24, 2)
    lora = read_lora(save({keys[0]: down, keys[1]: up}, tmp_path / "layout.safetensors"))
    assert list(lora.targets) == [module]
    assert torch.equal(lora.targets[module].low_rank.down, down) and torch.equal(lora.targets[module].low_rank.up, up)
    assert lora.targets[module].low_rank.scale == 1.0 and lora.targets[module].low_rank.alpha is None
    assert lora.format == expected_format


def test_peft_lora_bias_is_a_bias_diff(tmp_path):
    bias = torch.randn(24)
    sd = {**_to_q_pair(), "blocks.0.attn1.to_q.lora_B.bias": bias}
    patch = read_lora(save(sd, tmp_path / "bias.safetensors")).targets["blocks.0.attn1.to_q"]
    assert torch.equal(patch.param_diffs["bias"], bias) and set(patch.param_diffs) == {"bias"}


def test_cache_returns_the_same_object_until_the_file_changes(small_lora):
    path, sd = small_lora
    first = read_lora(path)
    assert read_lora(path) is first
    changed = dict(sd)
    changed["diffusion_model.blocks.0.self_attn.q.alpha"] = torch.tensor(2.0)
    save(changed, path)
    stat = os.stat(path)
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))
    second = read_lora(path)
    assert second is not first
    assert second.targets["blocks.0.self_attn.q"].low_rank.alpha == 2.0


def test_a_rewrite_in_place_with_the_same_size_and_mtime_is_read_again(small_lora):
    path, sd = small_lora
    up_key = "diffusion_model.blocks.0.self_attn.q.lora_up.weight"
    first = read_lora(path)
    stat = os.stat(path)
    header, data = _raw_header(path)
    high_byte = len(open(path, "rb").read()) - len(data) + header[up_key]["data_offsets"][1] - 1
    with open(path, "r+b") as handle:  # in place: the same inode, size and (set back) mtime
        handle.seek(high_byte)
        original = handle.read(1)[0]
        handle.seek(high_byte)
        handle.write(bytes([original ^ 0x80]))  # the sign of the factor's last element
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    after = os.stat(path)
    assert (after.st_ino, after.st_size, after.st_mtime_ns) == (stat.st_ino, stat.st_size, stat.st_mtime_ns)
    second = read_lora(path)
    assert second is not first
    up = second.targets["blocks.0.self_attn.q"].low_rank.up
    assert up.reshape(-1)[-1].item() == -sd[up_key].reshape(-1)[-1].item()


def test_peft_folder_config_errors_name_the_folder(tmp_path):
    sd = {"base_model.model.blocks.0.attn1.to_q.lora_A.weight": torch.randn(2, 24),
          "base_model.model.blocks.0.attn1.to_q.lora_B.weight": torch.randn(24, 2)}
    for name, config, message in (
            ("dora", {"r": 2, "lora_alpha": 2, "use_dora": True},
             r"dora: adapter config says use_dora=true, but module 'blocks\.0\.attn1\.to_q' has no "
             r"lora_magnitude_vector"),
            ("bad_pattern", {"r": 2, "rank_pattern": {"to_q(": 2}}, r"bad_pattern: adapter config has an invalid"),
            ("no_config", None, r"no_config: PEFT folder has adapter_model\.safetensors but no adapter_config\.json")):
        folder = tmp_path / name
        folder.mkdir()
        save(sd, folder / "adapter_model.safetensors")
        if config is not None:
            (folder / "adapter_config.json").write_text(json.dumps(config))
        with pytest.raises(LoraFileError, match=message):
            read_lora(str(folder))
    ok = tmp_path / "defaults"
    ok.mkdir()
    save(sd, ok / "adapter_model.safetensors")
    (ok / "adapter_config.json").write_text(json.dumps({"r": 2}))  # LoraConfig's default lora_alpha is 8
    assert read_lora(str(ok)).targets["blocks.0.attn1.to_q"].low_rank.scale == 8 / 2
