"""Re-reads of file-backed originals by plain reads into one reused buffer (``io.safetensors_reads``): the same
bits as safetensors' own reader, for every dtype a weight is stored in, and a fallback where the table is unknown."""

import pytest
import torch
from safetensors.torch import save_file

from lorabind.loaders.io import safetensors_reads
from lorabind.loaders.io.safetensors_reads import ReadBuffer
from lorabind.loaders.io.weight_sources import FileIdentity, WeightSource, checksum, read_tensor


@pytest.fixture
def model_file(tmp_path):
    g = torch.Generator().manual_seed(0)
    tensors = {
        "big.weight": torch.randn(64, 48, generator=g).to(torch.bfloat16),
        "small.weight": torch.randn(3, 5, generator=g),
        "half": torch.randn(7, generator=g).to(torch.float16),
        "fp8": torch.randn(4, 4, generator=g).to(torch.float8_e4m3fn),
        "scalar": torch.tensor(2.5),
        "empty": torch.zeros(0, 3),
    }
    path = tmp_path / "model.safetensors"
    save_file(tensors, str(path))
    safetensors_reads.tables.clear()
    return str(path), tensors


def _bits(tensor):
    return tensor.contiguous().reshape(-1).view(torch.uint8)


def test_buffered_reads_give_the_files_bits_in_the_files_dtype_and_shape(model_file):
    path, tensors = model_file
    buffer, identity = ReadBuffer(), FileIdentity.of(path)
    for key, expected in tensors.items():  # largest first and smaller after: the buffer is reused, not regrown
        value = read_tensor(WeightSource(path, key), expected.dtype, buffer, identity)
        assert value.dtype == expected.dtype and value.shape == expected.shape
        assert torch.equal(_bits(value), _bits(expected))


def test_a_buffered_read_is_cast_like_a_safe_open_read(model_file):
    path, tensors = model_file
    buffer, identity = ReadBuffer(), FileIdentity.of(path)
    value = read_tensor(WeightSource(path, "big.weight"), torch.float32, buffer, identity)
    assert value.dtype == torch.float32
    assert torch.equal(value, read_tensor(WeightSource(path, "big.weight"), torch.float32))


def test_a_key_or_header_the_table_does_not_know_falls_back_to_safetensors(model_file, tmp_path):
    path, _ = model_file
    buffer = ReadBuffer()
    assert buffer.read(path, FileIdentity.of(path), "missing") is None
    broken = tmp_path / "not-safetensors.bin"
    broken.write_bytes(b"\xff" * 64)
    assert buffer.read(str(broken), FileIdentity.of(str(broken)), "big.weight") is None


def test_a_file_cut_short_after_its_table_was_read_answers_none(model_file):
    path, _ = model_file
    buffer, identity = ReadBuffer(), FileIdentity.of(path)
    assert buffer.read(path, identity, "big.weight") is not None
    with open(path, "r+b") as handle:
        header_len = int.from_bytes(handle.read(8), "little")
        handle.truncate(8 + header_len + 10)  # every tensor but the first few bytes of data is cut off
    # the caller checks the identity before reading; here the stale table meets the short file
    assert buffer.read(path, identity, "big.weight") is None


@pytest.mark.parametrize("part", [(0, 16, 48), (1, 0, 24), (1, 24, 48), (0, 0, 64)])
def test_a_tensor_parallel_shard_is_read_as_its_own_rows_or_columns(model_file, part):
    """A rank's shard (``WeightSource.part``: rows or columns of the stored tensor) reads the same bits through the
    buffer as through safetensors' slices, contiguous, in the shard's shape (issue 60: a rank re-reads its shard's
    original from the file instead of keeping a RAM copy)."""
    path, tensors = model_file
    dim, start, stop = part
    expected = tensors["big.weight"].narrow(dim, start, stop - start)
    source = WeightSource(path, "big.weight").shard(*part)
    buffered = read_tensor(source, torch.bfloat16, ReadBuffer(), FileIdentity.of(path))
    mapped = read_tensor(source, torch.bfloat16)
    assert buffered.is_contiguous()  # cut into the buffer's second region
    for value in (buffered, mapped):
        assert value.shape == expected.shape and torch.equal(_bits(value), _bits(expected))
    assert checksum(mapped) == checksum(expected.contiguous())  # the columns hashed where they lie, alike


def test_a_part_outside_the_stored_tensor_is_not_read(model_file):
    path, _ = model_file
    identity = FileIdentity.of(path)
    for part in ((0, 60, 70), (2, 0, 1), (1, 10, 10)):
        assert ReadBuffer().read(path, identity, "big.weight", part) is None
        with pytest.raises(KeyError):
            read_tensor(WeightSource(path, "big.weight", part=part), torch.bfloat16)


def test_owned_reads_give_the_files_bits_where_a_mapping_would_put_them_in_memory_of_their_own(model_file):
    """A weight re-read for keeps (a staged upload, a LoRA's factors) is never a mapping of its file (a truncated
    file would fault it, issue 52) and sits at the address modulo 64 a mapping gives it (the CPU kernels round by
    alignment, so a re-read weight computes what the loaded one did)."""
    from safetensors import safe_open

    from lorabind.loaders.placement.file_pages import file_mapped_ranges

    path, tensors = model_file
    identity = FileIdentity.of(path)
    together = safetensors_reads.read_all_owned(path, identity, list(tensors))
    with safe_open(path, framework="pt") as handle:
        for key, expected in tensors.items():
            alone = read_tensor(WeightSource(path, key), expected.dtype)
            mapped = handle.get_tensor(key)
            for value in (alone, together[key]):
                assert value.dtype == expected.dtype and value.shape == expected.shape
                assert torch.equal(_bits(value), _bits(expected))
                if value.numel():
                    assert value.data_ptr() % 64 == mapped.data_ptr() % 64
                    assert not file_mapped_ranges().holds(value.data_ptr())
    assert safetensors_reads.read_all_owned(path, identity, ["big.weight", "absent"]) is None


def test_a_table_is_never_remembered_under_a_version_the_file_no_longer_has(model_file):
    """Issue 54's audit: a file that changes between the caller's check and the read must not have its new table
    cached under the old version (a later read "of the old version" would use it)."""
    path, tensors = model_file
    old = FileIdentity.of(path)
    save_file({key: t.clone() for key, t in tensors.items() if key != "small.weight"}, path)  # a new version
    assert safetensors_reads.read_owned(path, old, "big.weight") is None
    assert safetensors_reads.tables.table(path, old) is None
    new = FileIdentity.of(path)
    assert torch.equal(_bits(safetensors_reads.read_owned(path, new, "big.weight")), _bits(tensors["big.weight"]))
