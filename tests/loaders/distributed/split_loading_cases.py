"""What each rank of the split-loading test runs: every denoiser read split (``loaders.models.split_loading``)
against the same denoiser loaded whole and then split in memory (``apply_tensor_parallel``), which the other
tensor-parallel tests hold to the unsharded model.

Measured per rank: the bytes read of the split parameters against their whole bytes, and whether every
parameter's local part and the forward output equal the split-after-loading ones bit for bit (the outputs with
every weight in allocator memory; as loaded, within a tolerance: ``_rehome`` says why).
"""

from __future__ import annotations

import contextlib
import math
from pathlib import Path

import torch
from tensor_parallel_cases import qwen_inputs, qwen_transformer, wan_inputs, wan_transformer

from lorabind.loaders.distributed import process_group
from lorabind.loaders.distributed.spec import parse_parallel
from lorabind.loaders.models.diffusers_folder import DiffusersFolder
from lorabind.loaders.models.store import clear_cache, load, load_model
from lorabind.loaders.models.tensor_parallel import apply_tensor_parallel


def _local(param) -> torch.Tensor:
    return param.to_local() if hasattr(param, "placements") else param.detach()


def _rehome(module: torch.nn.Module) -> None:
    """Every parameter's local part copied into memory of torch's own allocator (64-byte aligned).

    Why: a parameter read from a safetensors file is a view of the mapped file at the tensor's offset there, so its
    address is aligned as the file happens to lay it out, while one cut in memory sits where the allocator put it.
    MKL's single-row product (a batch-1 linear: the timestep embedding) peels the unaligned head of a row before
    its vector loop, so the same values at another alignment are summed in another order: one ulp on an
    AVX-512 CPU. Equal weights at equal alignment must give equal outputs, bit for bit."""
    for param in module.parameters():
        local = param._local_tensor if hasattr(param, "placements") else param
        local.data = local.data.clone()


def _forward(module: torch.nn.Module, inputs: dict) -> torch.Tensor:
    with torch.no_grad():
        return module(**inputs, return_dict=False)[0]


def _compare(split: torch.nn.Module, reference: torch.nn.Module, inputs: dict) -> dict:
    """Each parameter's local part and the forward output, split-on-load against split-after-loading: the outputs
    as loaded (their difference, see ``_rehome``), then bit for bit with both modules' weights re-homed."""
    references = dict(reference.named_parameters())
    equal = {name: torch.equal(_local(p), _local(references[name])) and
             str(getattr(p, "placements", "")) == str(getattr(references[name], "placements", ""))
             for name, p in split.named_parameters()}
    as_loaded = [_forward(m, inputs) for m in (split, reference)]
    for module in (split, reference):
        _rehome(module)
    rehomed = [_forward(m, inputs) for m in (split, reference)]
    return {"parameters_equal": equal, "output_equal": torch.equal(*rehomed),
            "output_difference": (as_loaded[0] - as_loaded[1]).abs().max().item(), "output_dtype": str(rehomed[0].dtype),
            "heads": sorted({m.heads for n, m in split.named_modules() if n.endswith(("attn1", "attn2", ".attn"))})}


class _CountedSlice:
    """A safetensors slice that records the bytes of every tensor read through it."""

    def __init__(self, inner, key: str, read: dict):
        self.inner, self.key, self.read = inner, key, read

    def __getitem__(self, index):
        tensor = self.inner[index]
        self.read[self.key] = self.read.get(self.key, 0) + tensor.numel() * tensor.element_size()
        return tensor

    def __getattr__(self, name):
        return getattr(self.inner, name)


_STORED_BYTES = {"F64": 8, "F32": 4, "BF16": 2, "F16": 2, "I64": 8, "I32": 4, "F8_E4M3": 1, "U8": 1, "BOOL": 1}


@contextlib.contextmanager
def counting_reads(under: str):
    """``({key: bytes read}, {key: bytes stored})`` of every tensor read through ``safetensors.safe_open`` from
    files whose path contains ``under``: what a rank materialised of each stored tensor, whichever code read it,
    against the tensor's size in the file."""
    import safetensors

    read: dict = {}
    stored: dict = {}
    original = safetensors.safe_open

    class Counted:
        def __init__(self, path, *args, **kwargs):
            self.counting = under in str(path)
            self.handle = original(path, *args, **kwargs)

        def __enter__(self):
            self.inner = self.handle.__enter__()
            return self

        def __exit__(self, *exc):
            return self.handle.__exit__(*exc)

        def get_slice(self, key):
            found = self.inner.get_slice(key)
            if not self.counting:
                return found
            stored[key] = math.prod(found.get_shape()) * _STORED_BYTES[found.get_dtype()]
            return _CountedSlice(found, key, read)

        def get_tensor(self, key):
            tensor = self.inner.get_tensor(key)
            if self.counting:
                read[key] = read.get(key, 0) + tensor.numel() * tensor.element_size()
                stored[key] = tensor.numel() * tensor.element_size()
            return tensor

        def __getattr__(self, name):
            return getattr(self.inner, name)

    safetensors.safe_open = Counted
    try:
        yield read, stored
    finally:
        safetensors.safe_open = original


def _read_shares(read: dict, stored: dict, split_names) -> dict:
    """Bytes read against bytes stored, for the split parameters and for the rest."""
    rest = set(stored) - set(split_names)
    return {"split": (sum(read.get(n, 0) for n in split_names), sum(stored.get(n, 0) for n in split_names)),
            "rest": (sum(read.get(n, 0) for n in rest), sum(stored[n] for n in rest))}


def _bfloat16(inputs: dict) -> dict:
    return {k: v.to(torch.bfloat16) if torch.is_tensor(v) and v.is_floating_point() else v for k, v in inputs.items()}


class _WholeReadingFolder(DiffusersFolder):
    """A source that reads its denoisers whole whatever it is asked (a plug-in's source): the store splits them
    after loading. Its own cache identity, so the store does not hand back the model read split."""

    def build(self, dtype, split=None):
        return super().build(dtype)

    def cache_identity(self) -> tuple:
        identity, version = super().cache_identity()
        return f"{identity}#whole-reading", version


def _planned_names(module: torch.nn.Module, family: str) -> frozenset:
    """The parameters the family's plan splits two ways (the linears; Wan's across-head norms are read whole and
    cut after, being a few hundred bytes)."""
    from lorabind.loaders.families import family_by_id
    from lorabind.loaders.models.tensor_parallel import sharded_parameter_names

    return sharded_parameter_names(module, family_by_id(family).sampling.tensor_parallel_plan(module), 2)


def run_folder(models_root: str) -> dict:
    """The tiny Wan2.1 folder: loaded whole and split after, then loaded under tp=2 (split while read)."""
    from lorabind.tiny_models.wan import WAN21_NAME

    folder = str(Path(models_root) / "diffusers" / WAN21_NAME)
    whole = load_model(folder, name=WAN21_NAME, dtype="bfloat16")  # a cast, and Wan's float32-kept modules
    apply_tensor_parallel(whole, 2)
    process_group.join_job(parse_parallel("tp=2"), "cpu")
    try:
        with counting_reads(f"{WAN21_NAME}/transformer/") as (read, stored):
            split = load_model(folder, name=WAN21_NAME, dtype="bfloat16")
        after = load(_WholeReadingFolder(folder, name=WAN21_NAME), dtype="bfloat16", attention="native")
    finally:
        process_group.leave_job()
    result_after = _compare(after.components["transformer"], whole.components["transformer"],
                            _bfloat16(wan_inputs(after.components["transformer"])))
    transformer = split.components["transformer"]
    reference = whole.components["transformer"]
    result = _compare(transformer, reference, _bfloat16(wan_inputs(transformer)))
    split_names = _planned_names(wan_transformer("wan2.1"), "wan2.1")
    result["read"] = _read_shares(read, stored, split_names)
    result["split_after_reading_whole"] = {"equal": all(result_after["parameters_equal"].values()),
                                           "reports": [r.component for r in after.tensor_parallel]}
    result["reports"] = [(r.component, r.sharded_parameters, r.local_bytes, r.full_bytes)
                         for r in split.tensor_parallel]
    clear_cache()
    return result


def run_sharded_qwen(folder: str) -> dict:
    """A two-head Qwen-Image transformer saved as a sharded diffusers component, read split by its family's plan
    (diffusers' ``_tp_plan``), against the same files loaded whole and split in memory. Loaded, not the module
    built in memory: a tensor held whole is the file's bytes where the file has them, and the CPU's kernels round
    an unaligned operand differently (3.6e-7 here) from an aligned copy of the same values."""
    from diffusers import QwenImageTransformer2DModel

    from lorabind.loaders.families import family_by_id
    from lorabind.loaders.models.split_loading import SplitLoad, load_split_denoiser

    reference = QwenImageTransformer2DModel.from_pretrained(Path(folder) / "transformer").eval().requires_grad_(False)
    split_load = SplitLoad(2, torch.device("cpu"))
    model_index = {"transformer": ["diffusers", "QwenImageTransformer2DModel"]}
    split = load_split_denoiser(Path(folder), "transformer", model_index, family_by_id("qwen_image"), split_load,
                                None, "tiny-qwen", "qwen_image")
    apply_tensor_parallel(_Loaded(reference, "qwen_image"), 2)
    result = _compare(split, reference, qwen_inputs(reference))
    report = split_load.reports["transformer"]
    result["reports"] = [(report.component, report.sharded_parameters, report.local_bytes, report.full_bytes)]
    return result


class _Loaded:
    """The ``LoadedModel`` fields ``apply_tensor_parallel`` reads."""

    def __init__(self, module, family: str):
        self.family, self.components, self.binding_state = family, {"transformer": module}, None


def save_sharded_qwen(folder: Path) -> None:
    """The two-head tiny Qwen-Image transformer in several safetensors shards with their index."""
    qwen_transformer().save_pretrained(folder / "transformer", max_shard_size="40KB", safe_serialization=True)


def _single_files(models_root: str, denoiser: str):
    """The tiny Wan2.1 single-file set with ``denoiser`` (a file name under ``diffusion_models/lorabind-tiny``)."""
    from lorabind.loaders.models.single_file.pipelines import detect_set
    from lorabind.tiny_models.single_files import SUBFOLDER, UMT5_STEM

    root = Path(models_root)
    def part(folder: str, name: str) -> tuple:
        return str(root / folder / SUBFOLDER / name), name
    return detect_set([part("diffusion_models", denoiser)], part("vae", "wan_2.1_vae_tiny.safetensors"),
                      part("text_encoders", f"{UMT5_STEM}_bf16.safetensors"))


def run_single_file(models_root: str) -> dict:
    """The tiny Wan2.1 bf16 single file read split under tp=2 (its layout's renames on the way) against the same
    file loaded whole and split after; an fp8 and a GGUF denoiser under tp=2 are refused by name."""
    from lorabind.loaders.models.single_file.pipelines import load_single_files
    from lorabind.tiny_models.wan import WAN21_NAME

    tokenizers = [Path(models_root) / "diffusers" / WAN21_NAME / "tokenizer"]
    whole = load_single_files(_single_files(models_root, "wan2.1_t2v_tiny_bf16.safetensors"), tokenizer_dirs=tokenizers)
    apply_tensor_parallel(whole, 2)
    process_group.join_job(parse_parallel("tp=2"), "cpu")
    refusals = {}
    files = _single_files(models_root, "wan2.1_t2v_tiny_bf16.safetensors")
    try:
        with counting_reads("wan2.1_t2v_tiny_bf16") as (read, stored):
            split = load_single_files(files, tokenizer_dirs=tokenizers)
        for kind, name in (("fp8", "wan2.1_t2v_tiny_fp8_scaled.safetensors"),
                           ("gguf", "wan2.2_t2v_high_noise_tiny_Q8_0.gguf")):
            try:
                load_single_files(_single_files(models_root, name), tokenizer_dirs=tokenizers)
                refusals[kind] = "no error"
            except Exception as exc:  # the test asserts the type through the text
                refusals[kind] = f"{type(exc).__name__}: {exc}"
    finally:
        process_group.leave_job()
    transformer = split.components["transformer"]
    reference = whole.components["transformer"]
    result = _compare(transformer, reference, _bfloat16(wan_inputs(transformer)))
    detected = files.denoisers[0]
    layout = detected.kind.layout(detected.config)
    native = {detected.prefix + layout.to_native(name) for name in _planned_names(wan_transformer("wan2.1"), "wan2.1")}
    result["read"] = _read_shares(read, stored, native)
    result["reports"] = [(r.component, r.sharded_parameters, r.local_bytes, r.full_bytes)
                         for r in split.tensor_parallel]
    result["refusals"] = refusals
    clear_cache()
    return result


def run_split_loads(rank: int, world_size: int, models_root: str, qwen_folder: str) -> dict:
    """Every case on this rank (one spawn of the ranks: each costs seconds of imports)."""
    return {"folder": run_folder(models_root), "qwen": run_sharded_qwen(qwen_folder),
            "single_file": run_single_file(models_root)}


