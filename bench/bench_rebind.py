"""Re-binding at real size with the published layout (issue 47): the full Wan2.1-1.3B transformer (30 blocks, random
bf16 weights) and two LoRAs in the layout of lightx2v's published Wan2.1 distill files (``workload.
write_published_lora``: 1,428 tensors, rank 64; low-rank pairs with bias diffs on all 300 block linears and the 6
embedding/head linears, norm and modulation diffs), on a model whose originals are re-read from its file.

Metrics:

* ``rebind_cached_vs_fuse_300``: a cached re-bind of the published-layout LoRA (bind after an unbind, the file
  already read) / a fuse of the bench's 300-linear LoRA (rank 64 pairs with ``diff_b``, no other diffs, the file
  re-read each time: the figure the performance page quoted, 1.39 s), both on the same model in the same run;
* ``strength_change_real_size_vs_diffusers`` and ``switch_real_size_vs_diffusers``: strength 1.0 -> 0.5 and
  switch A -> B, diffusers (unfuse + unload + load + fuse on its own loaded copy, ``bench_fuse.DiffusersSide``) /
  lorabind's incremental re-bind (a switch re-reads B, as diffusers does).

What each side applies, honestly: diffusers 0.42's lightx2v conversion keeps the low-rank pairs and turns ``diff_b``
into a bias delta (the 306 linears), but drops the norm diffs (``norm_q``/``norm_k`` of both attentions,
``norm3.diff``/``diff_b``: logged at debug level) and ``diff_m`` (logged at info level): 210 of the 1,428 tensors
at 1.3B. lorabind applies all of them (``scale_shift_table`` and the norm weights and biases are patched too).
So diffusers does a little less work than we do.

The same cases also run on a ComfyUI-layout single file (the native Wan keys, loaded by ``single_file.loading``
with ``SingleFileWeightSources``, as ``lorabind`` loads one): printed, no goal. ``--quick`` uses the tiny width.
"""

from __future__ import annotations

import gc
import json
import os
import sys
from pathlib import Path

import torch

from lorabind.loaders.binding import bind as binding
from lorabind.loaders.handles import FuseSpec
from lorabind.loaders.io.weight_sources import checksum
from lorabind.loaders.models.store import LoadedModel

from .bench_fuse import DiffusersSide, _drop_file_cache
from .bench_real_size import WAN21_1_3B, load_model, write_model
from .measure import alternate, timed
from .workload import QUICK, wan_config, write_lora, write_published_lora


def _fuse(path: str, strength: float = 1.0) -> FuseSpec:
    return FuseSpec(path=path, strength=strength, component="transformer", name=os.path.basename(path))


def _digests(model: LoadedModel) -> dict:
    return {k: checksum(v) for k, v in model.components["transformer"].state_dict().items()}


class OursTimers:
    """lorabind's side on one loaded model: each call returns the seconds of its timed part."""

    def __init__(self, model: LoadedModel, lora_a: str, lora_b: str, linears: str):
        self.model, self.a, self.b, self.linears = model, lora_a, lora_b, linears

    def fuse_300(self) -> float:
        _drop_file_cache(self.model)  # the file re-read, as the page's fuse figure measures it
        return timed(lambda: binding.bind(self.model, [_fuse(self.linears)], []),
                     teardown=lambda: binding.unbind(self.model))

    def cached_rebind(self) -> float:
        binding.bind(self.model, [_fuse(self.a)], [])  # reads and caches A (another case may have dropped it)
        binding.unbind(self.model)
        return timed(lambda: binding.bind(self.model, [_fuse(self.a)], []),
                     teardown=lambda: binding.unbind(self.model))

    def strength(self) -> float:
        binding.bind(self.model, [_fuse(self.a, 1.0)], [])
        return timed(lambda: binding.bind(self.model, [_fuse(self.a, 0.5)], []))

    def switch(self) -> float:
        binding.bind(self.model, [_fuse(self.a)], [])
        _drop_file_cache(self.model)  # B is read, as diffusers reads it
        return timed(lambda: binding.bind(self.model, [_fuse(self.b)], []))


def _diffusers_timers(theirs: DiffusersSide, lora_a: str, lora_b: str):
    def strength() -> float:
        theirs.load_and_fuse(lora_a, 1.0)
        return timed(lambda: theirs.switch(lora_a, 0.5), teardown=theirs.unload)

    def switch() -> float:
        theirs.load_and_fuse(lora_a)
        return timed(lambda: theirs.switch(lora_b), teardown=theirs.unload)

    return strength, switch


def write_single_file(directory: str, folder: str, size) -> tuple[str, str]:
    """The folder's transformer as a ComfyUI-layout single file (native Wan keys, bf16) and its config.json."""
    from safetensors.torch import load_file, save_file

    from lorabind.loaders.families import family_by_id
    from lorabind.loaders.models.single_file import catalog
    from lorabind.loaders.models.single_file.native_files import native_tensors

    config = {**catalog.config("wan2.1_t2v_1.3B"), **wan_config(size)}
    path, config_path = os.path.join(directory, "wan21-native.safetensors"), os.path.join(directory, "native.json")
    Path(config_path).write_text(json.dumps(config))
    if not os.path.isfile(path):
        state = load_file(os.path.join(folder, "transformer", "diffusion_pytorch_model.safetensors"))
        kind = family_by_id("wan2.1").layout.single_file_kinds[0]  # the family's first kind is its denoiser
        save_file(native_tensors(state, kind.layout(config)), path)
        del state
        gc.collect()
    return path, config_path


def load_single_file(path: str, config_path: str) -> LoadedModel:
    from lorabind.loaders.families import family_by_id
    from lorabind.loaders.io.single_file_kinds import KnownModel
    from lorabind.loaders.models.single_file import catalog
    from lorabind.loaders.models.single_file.detect import detect
    from lorabind.loaders.models.single_file.loading import load_component
    from lorabind.loaders.models.single_file.pipelines import SingleFileWeightSources

    kind = family_by_id("wan2.1").layout.single_file_kinds[0]
    probe = KnownModel(config=config_path, kind=kind.kind, title="bench", size="bench", variant="t2v")
    detected = detect(path, os.path.basename(path), models=catalog.known_models() + (probe,))
    transformer = load_component(detected, dtype=torch.bfloat16)
    return LoadedModel(path=path, name="wan21-native", family="wan2.1", pipeline=None,
                       components={"transformer": transformer},
                       weight_sources=SingleFileWeightSources({"transformer": detected}))


def _folder_cases(folder: str, loras: tuple, reps: int) -> dict:
    ours_model = load_model(folder)
    base = _digests(ours_model)
    ours = OursTimers(ours_model, *loras)
    rebind = alternate("lorabind 300-linear fuse (file read)", ours.fuse_300,
                       "lorabind cached re-bind (published layout)", ours.cached_rebind, reps)
    theirs = DiffusersSide(load_model(folder).components["transformer"])
    theirs_strength, theirs_switch = _diffusers_timers(theirs, loras[0], loras[1])
    strength = alternate("diffusers re-fuse at 0.5", theirs_strength, "lorabind strength change", ours.strength, reps)
    switch = alternate("diffusers unfuse+unload+load+fuse", theirs_switch, "lorabind re-bind A -> B", ours.switch,
                       reps)
    binding.unbind(ours_model)
    exact = _digests(ours_model) == base
    del theirs, ours_model
    gc.collect()
    return {"rebind": rebind, "strength": strength, "switch": switch, "unbind_bit_exact": exact}


def _single_file_cases(directory: str, folder: str, size, loras: tuple, reps: int) -> dict:
    model = load_single_file(*write_single_file(directory, folder, size))
    ours = OursTimers(model, *loras)
    rebind = alternate("300-linear fuse", ours.fuse_300, "cached re-bind", ours.cached_rebind, reps)
    strength = sorted(ours.strength() for _ in range(reps))[reps // 2]
    switch = sorted(ours.switch() for _ in range(reps))[reps // 2]
    binding.unbind(model)
    held = binding.bind(model, [_fuse(loras[0])], []).restore_sources["transformer"]
    binding.unbind(model)
    del model
    gc.collect()
    return {"rebind": rebind, "strength_s": strength, "switch_s": switch, "file_backed": held["file"],
            "ram_backups": held["ram"]}


def run(directory: str, quick: bool, reps: int) -> dict:
    size = QUICK if quick else WAN21_1_3B
    folder = os.path.join(directory, "wan21-1.3b-random")
    if not os.path.isdir(folder):  # bench_real_size writes the same model into the same run's folder
        write_model(directory, size)
    loras = (write_published_lora(os.path.join(directory, "published_a.safetensors"), size, seed=11),
             write_published_lora(os.path.join(directory, "published_b.safetensors"), size, seed=12),
             write_lora(os.path.join(directory, "linears_300.safetensors"), size, seed=13))
    result = _folder_cases(folder, loras, reps)
    result["single_file"] = _single_file_cases(directory, folder, size, loras, reps)
    result["label"] = f"{'tiny bench width (--quick)' if quick else 'Wan2.1-1.3B transformer'}, {size.layers} blocks"
    return result


def single_file_row(result: dict) -> dict:
    """The single-file figures (seconds, counts) of ``run``'s result, for printing and the JSON."""
    found = result["single_file"]
    return {"fuse_300_s": found["rebind"].a, "cached_rebind_s": found["rebind"].b,
            "cached_rebind_vs_fuse_300": found["rebind"].b / found["rebind"].a, "strength_change_s": found["strength_s"],
            "switch_s": found["switch_s"], "file_backed": found["file_backed"], "ram_backups": found["ram_backups"]}


if __name__ == "__main__":
    import tempfile

    with tempfile.TemporaryDirectory(prefix="lorabind-rebind-") as tmp:
        found = run(tmp, "--quick" in sys.argv, 2 if "--quick" in sys.argv else 3)
    for key in ("rebind", "strength", "switch"):
        pair = found[key]
        print(f"{pair.name_a}: {pair.a:.3f} s  {pair.name_b}: {pair.b:.3f} s  ratio {pair.a / pair.b:.2f}")
    print(f"single file: {single_file_row(found)}; unbind bit-exact: {found['unbind_bit_exact']}")
