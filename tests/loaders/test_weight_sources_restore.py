"""File-backed originals: a weight loaded unmodified from safetensors is restored by re-reading its file,
bit-exactly, with no RAM copy; anything else keeps a copy; a file changed on disk is never used."""

import dataclasses
import json
import os

import pytest
import torch
from safetensors.torch import save_file

from engine_probes import backup_bytes
from lorabind.loaders.binding.bind import bind, unbind
from lorabind.loaders.handles import FuseSpec
from lorabind.loaders.io.weight_sources import WeightSourceError
from lorabind.loaders.lora import clear_lora_cache
from lorabind.loaders.models.store import LoadedModel

LINEARS = ("attn1.to_q", "attn1.to_v", "ffn.net.0.proj")


@pytest.fixture(autouse=True)
def _fresh_reader_cache():
    clear_lora_cache()
    yield
    clear_lora_cache()


def _tiny_transformer():
    from diffusers import WanTransformer3DModel

    torch.manual_seed(0)
    return WanTransformer3DModel(
        patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=12, in_channels=16, out_channels=16,
        text_dim=32, freq_dim=256, ffn_dim=32, num_layers=2, cross_attn_norm=True,
        qk_norm="rms_norm_across_heads", rope_max_seq_len=32,
    ).eval()


def _load(folder, dtype):
    from diffusers import WanTransformer3DModel

    module = WanTransformer3DModel.from_pretrained(folder / "transformer", torch_dtype=dtype).eval()
    return LoadedModel(path=str(folder), name="tiny", family="wan2.1", pipeline=None,
                       components={"transformer": module.requires_grad_(False)})


def _saved_model(tmp_path, file_dtype):
    folder = tmp_path / f"model-{str(file_dtype).removeprefix('torch.')}"
    _tiny_transformer().to(file_dtype).save_pretrained(folder / "transformer", safe_serialization=True)
    return folder


def _lora(tmp_path, name, seed, modules):
    g = torch.Generator().manual_seed(seed)
    reference = _tiny_transformer()
    tensors = {}
    for path in modules:
        weight = reference.get_submodule(path).weight
        tensors[f"transformer.{path}.lora_A.weight"] = torch.randn(4, weight.shape[1], generator=g) * 0.1
        tensors[f"transformer.{path}.lora_B.weight"] = torch.randn(weight.shape[0], 4, generator=g) * 0.1
    file = tmp_path / name
    save_file(tensors, str(file))
    return str(file)


def _bits(module):
    return {k: v.detach().clone().reshape(-1).view(torch.uint8) for k, v in module.state_dict().items()}


def _assert_bits_equal(before, module):
    after = _bits(module)
    assert [k for k in before if not torch.equal(before[k], after[k])] == []


def _targets(blocks=(0, 1)):
    return [f"blocks.{b}.{name}" for b in blocks for name in LINEARS]


@pytest.mark.parametrize("file_dtype, run_dtype", [
    (torch.bfloat16, torch.bfloat16), (torch.float32, torch.float32), (torch.float32, torch.bfloat16),
])
def test_file_backed_restore_is_bit_exact_and_holds_no_copy(tmp_path, file_dtype, run_dtype):
    model = _load(_saved_model(tmp_path, file_dtype), run_dtype)
    transformer = model.components["transformer"]
    base = _bits(transformer)
    lora = _lora(tmp_path, "a.safetensors", 1, _targets())
    report = bind(model, [FuseSpec(path=lora, component="transformer", strength=1.0)], [])
    patched = transformer.get_submodule("blocks.0.attn1.to_q").weight
    assert not torch.equal(patched.reshape(-1).view(torch.uint8), base["blocks.0.attn1.to_q.weight"])
    touched_bytes = sum(transformer.get_submodule(p).weight.nbytes for p in _targets())
    # every touched weight is re-readable from the file: no RAM backup at all, only its checksum and identity
    assert report.restore_sources == {"transformer": {"file": len(_targets()), "file_bytes": touched_bytes,
                                                      "ram": 0, "ram_bytes": 0}}
    assert backup_bytes(model.binding_state.patcher) == 0
    unbind(model)
    _assert_bits_equal(base, transformer)


def test_bind_switch_unbind_restores_from_the_file(tmp_path):
    model = _load(_saved_model(tmp_path, torch.bfloat16), torch.bfloat16)
    transformer = model.components["transformer"]
    base = _bits(transformer)
    first = _lora(tmp_path, "first.safetensors", 1, _targets())
    second = _lora(tmp_path, "second.safetensors", 2, _targets(blocks=(1,)))
    bind(model, [FuseSpec(path=first, component="transformer", strength=1.0)], [])
    report = bind(model, [FuseSpec(path=second, component="transformer", strength=0.5)], [])
    # block 0 went back to its original (re-read from the file), block 1 was re-patched from the file's value
    assert (report.restored, report.written) == (len(LINEARS), len(LINEARS))
    assert report.restore_sources["transformer"]["file"] == len(LINEARS)
    block0 = {k: v for k, v in base.items() if k.startswith("blocks.0.")}
    assert all(torch.equal(v, _bits(transformer)[k]) for k, v in block0.items())
    unbind(model)
    _assert_bits_equal(base, transformer)


def test_weight_modified_after_loading_keeps_a_ram_backup(tmp_path):
    model = _load(_saved_model(tmp_path, torch.bfloat16), torch.bfloat16)
    transformer = model.components["transformer"]
    with torch.no_grad():  # no longer what the file holds: re-reading the file would "restore" the wrong bytes
        transformer.get_submodule("blocks.0.attn1.to_q").weight.mul_(2)
    base = _bits(transformer)
    lora = _lora(tmp_path, "a.safetensors", 1, _targets())
    report = bind(model, [FuseSpec(path=lora, component="transformer", strength=1.0)], [])
    modified = transformer.get_submodule("blocks.0.attn1.to_q").weight
    assert report.restore_sources["transformer"]["ram"] == 1
    assert report.restore_sources["transformer"]["ram_bytes"] == modified.nbytes
    assert report.restore_sources["transformer"]["file"] == len(_targets()) - 1
    unbind(model)
    _assert_bits_equal(base, transformer)


def test_without_a_file_every_original_is_a_ram_copy(tmp_path):
    model = _load(_saved_model(tmp_path, torch.bfloat16), torch.bfloat16)
    model.path = str(tmp_path / "elsewhere")  # no safetensors where the sources are looked up
    transformer = model.components["transformer"]
    report = bind(model, [FuseSpec(path=_lora(tmp_path, "a.safetensors", 1, _targets()), component="transformer",
                                   strength=1.0)], [])
    touched_bytes = sum(transformer.get_submodule(p).weight.nbytes for p in _targets())
    assert report.restore_sources["transformer"] == {"file": 0, "file_bytes": 0, "ram": len(_targets()),
                                                     "ram_bytes": touched_bytes}
    assert backup_bytes(model.binding_state.patcher) == touched_bytes


def _weights_file(folder):
    return folder / "transformer" / "diffusion_pytorch_model.safetensors"


def test_replaced_file_is_refused_before_anything_is_written(tmp_path):
    folder = _saved_model(tmp_path, torch.bfloat16)
    model = _load(folder, torch.bfloat16)
    transformer = model.components["transformer"]
    lora = _lora(tmp_path, "a.safetensors", 1, _targets())
    bind(model, [FuseSpec(path=lora, component="transformer", strength=1.0)], [])
    patched = _bits(transformer)
    # a re-download: same keys and shapes, other values, a new file
    other = _tiny_transformer()
    with torch.no_grad():
        for p in other.parameters():
            p.add_(1.0)
    other.to(torch.bfloat16).save_pretrained(folder / "transformer", safe_serialization=True)
    with pytest.raises(WeightSourceError) as caught:
        unbind(model)
    message = str(caught.value)
    assert "transformer/diffusion_pytorch_model.safetensors" in message and "changed on disk" in message
    assert str(tmp_path) not in message  # messages reach the browser: no local paths
    assert "reload the model" in message
    _assert_bits_equal(patched, transformer)  # nothing restored half-way, nothing restored wrong


def _flip_in_place(weights, key: str) -> None:
    """Flip the first two bytes of ``key``'s data in place, then set the mtime back: same inode, size, mtime."""
    stat = os.stat(weights)
    header_len = int.from_bytes(weights.read_bytes()[:8], "little")
    begin, _ = json.loads(weights.read_bytes()[8:8 + header_len])[key]["data_offsets"]
    with open(weights, "r+b") as handle:
        handle.seek(8 + header_len + begin)
        first = handle.read(2)
        handle.seek(8 + header_len + begin)
        handle.write(bytes(b ^ 0xFF for b in first))
    os.utime(weights, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    after = os.stat(weights)
    assert (after.st_ino, after.st_size, after.st_mtime_ns) == (stat.st_ino, stat.st_size, stat.st_mtime_ns)


def test_file_rewritten_in_place_with_the_old_mtime_is_refused_before_anything_is_written(tmp_path):
    folder = _saved_model(tmp_path, torch.bfloat16)
    model = _load(folder, torch.bfloat16)
    transformer = model.components["transformer"]
    lora = _lora(tmp_path, "a.safetensors", 1, _targets(blocks=(0,)))
    bind(model, [FuseSpec(path=lora, component="transformer", strength=1.0)], [])
    patched = _bits(transformer)
    _flip_in_place(_weights_file(folder), "blocks.0.attn1.to_q.weight")  # only the ctime moved
    with pytest.raises(WeightSourceError, match="changed on disk since the weight was patched"):
        unbind(model)
    _assert_bits_equal(patched, transformer)


def test_where_no_ctime_moves_the_checksum_still_refuses_a_rewrite_in_place(tmp_path, monkeypatch):
    """A file system whose identity misses an in-place rewrite (modelled: the ctime left out) is still caught by
    the re-read's checksum."""
    from lorabind.loaders.io import weight_sources

    real_of = weight_sources.FileIdentity.of.__func__
    monkeypatch.setattr(weight_sources.FileIdentity, "of",
                        classmethod(lambda cls, path: dataclasses.replace(real_of(cls, path), ctime_ns=0)))
    folder = _saved_model(tmp_path, torch.bfloat16)
    model = _load(folder, torch.bfloat16)
    lora = _lora(tmp_path, "a.safetensors", 1, _targets(blocks=(0,)))
    bind(model, [FuseSpec(path=lora, component="transformer", strength=1.0)], [])
    _flip_in_place(_weights_file(folder), "blocks.0.attn1.to_q.weight")
    with pytest.raises(WeightSourceError, match="its bytes differ from those the weight was loaded with"):
        unbind(model)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_file_backed_restore_of_weights_living_on_the_gpu(tmp_path):
    model = _load(_saved_model(tmp_path, torch.bfloat16), torch.bfloat16)
    transformer = model.components["transformer"].to("cuda")
    base = _bits(transformer)
    lora = _lora(tmp_path, "a.safetensors", 1, _targets())
    report = bind(model, [FuseSpec(path=lora, component="transformer", strength=1.0)], [])
    assert report.restore_sources["transformer"]["ram"] == 0
    assert transformer.get_submodule("blocks.0.attn1.to_q").weight.device.type == "cuda"
    unbind(model)
    _assert_bits_equal(base, transformer)


@pytest.fixture
def file_reads(monkeypatch):
    """Which tensors were read from a model file (every re-read goes through ``read_tensor``)."""
    from lorabind.loaders.io import weight_sources

    weight_sources.file_digests.clear()
    reads = []
    real = weight_sources.read_tensor

    def counting(source, dtype, *buffer_and_identity):
        reads.append(source.key)
        return real(source, dtype, *buffer_and_identity)

    monkeypatch.setattr(weight_sources, "read_tensor", counting)
    return reads


def test_a_bind_reads_each_file_tensor_once_per_file_version_then_only_to_restore(tmp_path, file_reads):
    folder = _saved_model(tmp_path, torch.bfloat16)
    model = _load(folder, torch.bfloat16)
    transformer = model.components["transformer"]
    base = _bits(transformer)
    lora = _lora(tmp_path, "a.safetensors", 1, _targets())
    weights = [f"{path}.weight" for path in _targets()]
    bind(model, [FuseSpec(path=lora, component="transformer", strength=1.0)], [])
    assert sorted(file_reads) == sorted(weights)  # first bind: the file side of each digest, once
    file_reads.clear()
    unbind(model)
    assert sorted(file_reads) == sorted(weights)  # a restore re-reads exactly the touched tensors
    file_reads.clear()
    report = bind(model, [FuseSpec(path=lora, component="transformer", strength=0.5)], [])
    assert file_reads == []  # the same file version again: proven by the cached digest, nothing read
    assert report.restore_sources["transformer"]["file"] == len(weights)
    unbind(model)
    _assert_bits_equal(base, transformer)
    os.utime(_weights_file(folder))  # a new modification time is a new file version: its digests are taken anew
    file_reads.clear()
    bind(model, [FuseSpec(path=lora, component="transformer", strength=1.0)], [])
    assert sorted(file_reads) == sorted(weights)
    unbind(model)
    _assert_bits_equal(base, transformer)


def test_cached_digest_still_refuses_a_file_changed_in_place(tmp_path, file_reads):
    folder = _saved_model(tmp_path, torch.bfloat16)
    model = _load(folder, torch.bfloat16)
    lora = _lora(tmp_path, "a.safetensors", 1, _targets(blocks=(0,)))
    bind(model, [FuseSpec(path=lora, component="transformer", strength=1.0)], [])
    unbind(model)
    bind(model, [FuseSpec(path=lora, component="transformer", strength=1.0)], [])  # registered from the cache
    _flip_in_place(_weights_file(folder), "blocks.0.attn1.to_v.weight")
    with pytest.raises(WeightSourceError, match="changed on disk since the weight was patched"):
        unbind(model)

def test_a_shard_is_registered_against_its_part_of_the_file_and_refused_against_another(tmp_path):
    """A tensor-parallel rank's shard is proven equal to its rows or columns of the stored tensor, so its original
    is re-read from the file (no RAM copy); the same shard named as another part is not registered."""
    from lorabind.loaders.io.weight_sources import FileBackedOriginal, WeightSource

    weight = torch.randn(8, 6, generator=torch.Generator().manual_seed(3)).to(torch.bfloat16)
    path = tmp_path / "w.safetensors"
    save_file({"w": weight}, str(path))
    source = WeightSource(str(path), "w")
    columns = weight[:, 3:].clone()
    record = FileBackedOriginal.register(source.shard(1, 3, 6), columns)
    assert record is not None and record.nbytes == columns.numel() * 2
    assert torch.equal(record.read("w"), columns)
    assert FileBackedOriginal.register(source.shard(1, 0, 3), columns) is None  # the other rank's columns
    assert FileBackedOriginal.register(source, columns) is None  # the whole tensor: another shape
