"""The bounded GGUF header scan: a valid file read exactly, hostile files refused by name before anything
announced is read (truncated, lying counts, unknown types, huge shapes, metadata bombs)."""

import struct

import pytest

from gguf_builders import (
    F32,
    Q8_0,
    gguf_file,
    gguf_string,
    kv_array_header,
    kv_string,
    kv_u32,
    one_f32_tensor_file,
    tensor_info,
)
from lorabind.loaders.errors import ModelLoadError
from lorabind.loaders.io import gguf_header
from lorabind.loaders.io.gguf_header import read_gguf_header
from lorabind.loaders.io.gguf_tensors import read_gguf_tensors


def _write(tmp_path, data: bytes, name: str = "model.gguf"):
    path = tmp_path / name
    path.write_bytes(data)
    return path


def _refused(path, *words):
    with pytest.raises(ModelLoadError) as caught:
        read_gguf_header(path, "user/model.gguf")
    message = str(caught.value)
    assert message.startswith("user/model.gguf: ")
    for word in words:
        assert word in message, message
    return message


def test_valid_file_header_and_tensor_values(tmp_path):
    path = _write(tmp_path, one_f32_tensor_file(rows=2, cols=4))
    header = read_gguf_header(path)
    assert header.architecture == "wan" and header.version == 3
    tensor = header.tensors["blocks.0.ffn.2.weight"]
    assert (tensor.type_name, tensor.shape, tensor.n_bytes, tensor.quantized) == ("F32", (2, 4), 32, False)
    assert tensor.offset == header.data_offset and header.data_offset % 32 == 0
    values = read_gguf_tensors(header, "model.gguf")["blocks.0.ffn.2.weight"]
    assert values.tolist() == [[0.0, 1.0, 2.0, 3.0], [4.0, 5.0, 6.0, 7.0]]


def test_truncated_file_is_refused(tmp_path):
    data = one_f32_tensor_file(rows=64, cols=64)
    _refused(_write(tmp_path, data[: len(data) - 100]), "blocks.0.ffn.2.weight", "truncated")
    _refused(_write(tmp_path, data[:30]), "truncated")  # inside the header
    _refused(_write(tmp_path, b""), "truncated")


def test_lying_tensor_count_is_refused(tmp_path):
    valid = one_f32_tensor_file()
    one_more = bytearray(valid)
    struct.pack_into("<Q", one_more, 8, 2)  # two tensors declared, one described: reads run into the data
    with pytest.raises(ModelLoadError, match="user/model.gguf: "):
        read_gguf_header(_write(tmp_path, bytes(one_more)), "user/model.gguf")
    huge = bytearray(valid)
    struct.pack_into("<Q", huge, 8, 1 << 40)
    _refused(_write(tmp_path, bytes(huge)), "1099511627776 tensors", "budget")
    keys = bytearray(valid)
    struct.pack_into("<Q", keys, 16, 1 << 62)
    _refused(_write(tmp_path, bytes(keys)), "metadata keys", "budget")


def test_unknown_and_unsupported_quantization_types_are_refused(tmp_path):
    unknown = gguf_file(tensors=[tensor_info("blocks.0.q.weight", (32, 2), 99, 0)], data=b"\0" * 128)
    _refused(_write(tmp_path, unknown), "blocks.0.q.weight", "type id 99", "Q8_0")
    iq2 = gguf_file(tensors=[tensor_info("blocks.0.q.weight", (256, 1), 16, 0)], data=b"\0" * 128)
    _refused(_write(tmp_path, iq2), "blocks.0.q.weight", "IQ2_XXS", "does not read")


def test_huge_declared_shapes_are_refused(tmp_path):
    huge = gguf_file(tensors=[tensor_info("blocks.0.q.weight", (1 << 32, 1 << 30), F32, 0)], data=b"\0" * 64)
    _refused(_write(tmp_path, huge), "blocks.0.q.weight", "not real")
    too_many_dims = gguf_file(tensors=[tensor_info("x", (1,) * 9, F32, 0)], data=b"\0" * 64)
    _refused(_write(tmp_path, too_many_dims), "'x'", "9 dimensions")
    bad_rows = gguf_file(tensors=[tensor_info("blocks.0.q.weight", (24, 2), Q8_0, 0)], data=b"\0" * 128)
    _refused(_write(tmp_path, bad_rows), "Q8_0", "multiple of 32")


def test_metadata_bombs_are_refused(tmp_path):
    # one array declaring 2**40 items in a 100-byte file: refused by the item budget, nothing allocated
    bomb = gguf_file([kv_array_header("tokenizer.ggml.tokens", 0, 1 << 40)])
    _refused(_write(tmp_path, bomb), "tokenizer.ggml.tokens", "metadata bomb")
    # a string array within the item budgets whose strings the file does not hold
    strings = gguf_file([kv_array_header("tokenizer.ggml.tokens", 8, 200_000) + gguf_string("a") * 3])
    _refused(_write(tmp_path, strings), "tokenizer.ggml.tokens", "truncated")
    # one string declaring a petabyte
    long_string = gguf_file([gguf_string("general.name") + struct.pack("<IQ", 8, 1 << 50)])
    _refused(_write(tmp_path, long_string), "general.name", "budget")
    nested = gguf_file([kv_array_header("x", 9, 1) + struct.pack("<IQ", 0, 0)])
    _refused(_write(tmp_path, nested), "nests arrays")


def test_inconsistent_layouts_are_refused(tmp_path):
    data = b"\0" * 64
    overlap = gguf_file(tensors=[tensor_info("a", (4,), F32, 0), tensor_info("b", (4,), F32, 0)], data=data)
    _refused(_write(tmp_path, overlap), "overlaps")
    misaligned = gguf_file(tensors=[tensor_info("a", (4,), F32, 4)], data=data)
    _refused(_write(tmp_path, misaligned), "'a'", "alignment")
    twice = gguf_file([kv_u32("general.alignment", 32), kv_u32("general.alignment", 32)])
    _refused(_write(tmp_path, twice), "general.alignment", "twice")
    bad_alignment = gguf_file([kv_u32("general.alignment", 3)])
    _refused(_write(tmp_path, bad_alignment), "general.alignment", "power of two")
    _refused(_write(tmp_path, b"GGML" + b"\0" * 60), "no GGUF magic")
    _refused(_write(tmp_path, gguf_file(version=1)), "version 1")


def test_orig_shape_metadata_gives_the_logical_shape(tmp_path):
    orig = kv_array_header(gguf_header.ORIG_SHAPE_KEY + "w", 5, 2) + struct.pack("<2i", 2, 8)
    good = gguf_file([orig], [tensor_info("w", (4, 4), F32, 0)], b"\0" * 64)
    assert read_gguf_header(_write(tmp_path, good)).tensors["w"].shape == (2, 8)
    wrong = kv_array_header(gguf_header.ORIG_SHAPE_KEY + "w", 5, 2) + struct.pack("<2i", 3, 8)
    bad = gguf_file([wrong], [tensor_info("w", (4, 4), F32, 0)], b"\0" * 64)
    _refused(_write(tmp_path, bad), "comfy.gguf.orig_shape.w")


def test_header_only_scan_reads_kv_strings(tmp_path):
    data = gguf_file([kv_string("general.architecture", "qwen_image"), kv_u32("general.file_type", 7)])
    header = read_gguf_header(_write(tmp_path, data))
    assert header.metadata == {"general.architecture": "qwen_image", "general.file_type": 7}
    assert header.architecture == "qwen_image" and header.tensors == {}


def _empty_strings_file(count: int) -> bytes:
    """Issue 46's metadata file: one tensor and ``tokenizer.tokens`` holding ``count`` empty strings."""
    tokens = kv_array_header("tokenizer.tokens", 8, count) + struct.pack("<Q", 0) * count
    return gguf_file([kv_string("general.architecture", "wan"), tokens],
                     [tensor_info("w", (4, 2), F32, 0)], struct.pack("<8f", *range(8)))


def test_string_array_items_are_budgeted_at_the_bound(tmp_path):
    bound = gguf_header.MAX_STRING_ITEMS
    header = read_gguf_header(_write(tmp_path, _empty_strings_file(bound)))
    assert len(header.metadata["tokenizer.tokens"]) == bound
    assert read_gguf_tensors(header, "model.gguf")["w"].tolist() == [[0, 1, 2, 3], [4, 5, 6, 7]]
    _refused(_write(tmp_path, _empty_strings_file(bound + 1)), "tokenizer.tokens", f"{bound + 1}", "budget")


def test_tensors_are_mapped_without_the_gguf_reader(tmp_path, monkeypatch):
    import gguf

    def no_reader(*args, **kwargs):
        raise AssertionError("GGUFReader re-parses the metadata without budgets")

    monkeypatch.setattr(gguf, "GGUFReader", no_reader)
    path = _write(tmp_path, one_f32_tensor_file(rows=2, cols=4))
    header = read_gguf_header(path)
    assert read_gguf_tensors(header, "model.gguf")["blocks.0.ffn.2.weight"].sum().item() == 28.0
    path.write_bytes(one_f32_tensor_file(rows=2, cols=4) + b"\0" * 32)  # rewritten since its header was read
    with pytest.raises(ModelLoadError, match="model.gguf: the file changed since its header was checked"):
        read_gguf_tensors(header, "model.gguf")
