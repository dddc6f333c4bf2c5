"""Fuse, switch, strength change and peak memory: diffusers vs lorabind on the same file and model.

Metrics (issue 7): 1. fuse speed-up vs diffusers (load_lora_adapter + fuse_lora; the model-level equivalent
of the pipeline's load_lora_weights, which only adds the key conversion we also time) and vs the floor
(``Floor``: a copy of each original, then the delta added with one rounding: one bfloat16 gemm, or float32 rows);
2. switch A -> B and a strength change 1.0 -> 0.5 (diffusers: unfuse + unload + load + fuse; lorabind:
incremental re-bind, restore bit-exact);
(3. peak memory is measured in a fresh process: see bench_memory.py.)
"""

from __future__ import annotations

import functools
import gc

import torch

from lorabind.loaders.binding import bind as binding
from lorabind.loaders.binding.fused_rows import CHUNK_BYTES, has_onednn_bf16_gemm
from lorabind.loaders.families import family_by_id
from lorabind.loaders.handles import FuseSpec
from lorabind.loaders.lora import clear_lora_cache, map_to_model, read_lora
from lorabind.loaders.models.store import LoadedModel

from .measure import alternate, timed
from .workload import build_transformer


def _lorabind_model(transformer) -> LoadedModel:
    return LoadedModel(path="<bench>", name="bench", family="wan2.1", pipeline=None,
                       components={"transformer": transformer})


def _fuse(path: str, strength: float = 1.0) -> FuseSpec:
    return FuseSpec(path=path, strength=strength, component="transformer", name=path.rsplit("/", 1)[-1])


def _diffusers_state(path: str) -> dict:
    from diffusers.loaders import WanLoraLoaderMixin

    state = WanLoraLoaderMixin.lora_state_dict(path)
    return {k.removeprefix("transformer."): v for k, v in state.items()}


class DiffusersSide:
    """diffusers' own path on its own copy of the model."""

    def __init__(self, transformer):
        self.model = transformer

    def load_and_fuse(self, path: str, scale: float = 1.0) -> None:
        self.model.load_lora_adapter(_diffusers_state(path), adapter_name="bench", prefix=None)
        self.model.fuse_lora(lora_scale=scale)

    def unload(self) -> None:
        self.model.unfuse_lora()
        self.model.unload_lora()

    def switch(self, path: str, scale: float = 1.0) -> None:
        self.unload()
        self.load_and_fuse(path, scale)


class Floor:
    """The least work any exact, exactly restorable fuse must do, with the factors already in memory: keep a copy
    of each original (restoring bit-exactly needs one when no file holds the weight, as here), then add the
    scaled delta with one rounding by the fastest exact method this CPU has — one bfloat16 gemm per layer
    (float32 accumulation, the weight added by the gemm's ``beta = 1``) where oneDNN runs bfloat16 gemms
    (``fused_rows.has_onednn_bf16_gemm``), else per row chunk of ``fused_rows.CHUNK_BYTES`` an upcast into one
    reused float32 buffer, ``addmm`` and one cast back. No file read, no accounting, no finite-value bound.

    Redefined twice in issue 33: first the whole-layer float32 upcast became the chunked loop (cheaper, and
    lorabind's fuse had come within 3% of it); then the one-gemm fuse (no float32 copy of the weight at all) made
    the chunked loop a floor lorabind beat. Adding float32 delta rows to the weight in one mixed-dtype ``add`` was
    measured too: slower than upcast + cast back on this torch (its casting add is not vectorised)."""

    def __init__(self, transformer, lora_path: str):
        mapped = read_lora_mapped(lora_path)
        modules = dict(transformer.named_modules())
        self.one_gemm = has_onednn_bf16_gemm()
        self.items = []
        for module_path, target in mapped.items():
            module = modules[module_path]
            lr = target.low_rank
            if self.one_gemm and module.weight.dtype == lr.up.dtype == torch.bfloat16:
                up, down = lr.up, lr.down
            else:
                up, down = lr.up.float() * lr.scale, lr.down.float()
            self.items.append((module.weight, up, down, lr.scale, module.bias, target.param_diffs.get("bias")))
        self.originals = [(w.detach().clone(), None if b is None else b.detach().clone())
                          for w, _, _, _, b, _ in self.items]
        self.backups: list = []
        widest = max(w.shape[1] for w, *_ in self.items)
        self.buffer = torch.empty(CHUNK_BYTES // 4 + widest, dtype=torch.float32)

    def _add_by_rows(self, weight, up, down) -> None:
        rows, cols = weight.shape
        step = max(1, CHUNK_BYTES // (4 * cols))
        for start in range(0, rows, step):
            stop = min(start + step, rows)
            chunk = self.buffer[: (stop - start) * cols].view(stop - start, cols)
            chunk.copy_(weight[start:stop])
            chunk.addmm_(up[start:stop], down)
            weight[start:stop].copy_(chunk)

    def run(self) -> None:
        with torch.no_grad():
            for weight, up, down, scale, bias, diff_b in self.items:
                self.backups.append((weight.clone(), None if bias is None else bias.clone()))
                if up.dtype == weight.dtype:
                    weight.addmm_(up, down, alpha=scale)
                else:
                    self._add_by_rows(weight, up, down)
                if diff_b is not None:
                    bias.copy_(bias.float() + diff_b.float())

    def restore(self) -> None:
        """Back to the originals; the backups are dropped, as an unbind drops a fuse's."""
        with torch.no_grad():
            for (weight, _, _, _, bias, _), (w0, b0) in zip(self.items, self.originals):
                weight.copy_(w0)
                if b0 is not None:
                    bias.copy_(b0)
        self.backups.clear()


def read_lora_mapped(path: str) -> dict:
    return map_to_model(read_lora(path), "wan2.1", family_by_id("wan2.1")).targets


def _drop_file_cache(model: LoadedModel) -> None:
    """Make every lorabind fuse re-read and re-account its file, as diffusers re-reads it, so both sides pay for
    reading (the engine otherwise keeps both for the next run of the same file)."""
    clear_lora_cache()
    if model.binding_state is not None:
        model.binding_state.accounted.clear()


def _state_equal(model, reference: dict) -> bool:
    current = model.state_dict()
    return all(torch.equal(current[k], v) for k, v in reference.items())


def fuse_timers(model: LoadedModel, theirs: DiffusersSide, lora_path: str):
    """``(diffusers load+fuse, lorabind fuse)``: each call fuses ``lora_path`` once (both sides read the file),
    undoes it untimed and returns the seconds the fuse took."""

    def ours_fuse() -> float:
        _drop_file_cache(model)
        return timed(lambda: binding.bind(model, [_fuse(lora_path)], []), teardown=lambda: binding.unbind(model))

    def theirs_fuse() -> float:
        return timed(lambda: theirs.load_and_fuse(lora_path), teardown=theirs.unload)

    return theirs_fuse, ours_fuse


def _fuse_reps(reps: int) -> int:
    """Repetitions of the fuse pair: at least 9 outside the smoke mode. Why: diffusers' load+fuse time is bimodal on
    the 2-core VM (0.39 s or 0.62 s per run, whether fresh pages are faulted in), and a median of 5 landed in either
    mode from run to run (fuse_speedup_vs_diffusers 1.48 in one quiet run, 2.1 in the next two)."""
    return reps if reps < 5 else max(reps, 9)


def run(size, lora_a: str, lora_b: str, reps: int) -> dict:
    ours_t = build_transformer(size, seed=0)
    theirs = DiffusersSide(build_transformer(size, seed=0))
    base_state = {k: v.clone() for k, v in ours_t.state_dict().items()}
    model = _lorabind_model(ours_t)

    theirs_fuse, ours_fuse = fuse_timers(model, theirs, lora_a)
    fuse = alternate("diffusers load+fuse", theirs_fuse, "lorabind fuse", ours_fuse, _fuse_reps(reps))

    floor = Floor(build_transformer(size, seed=0), lora_a)
    floor_pair = alternate("floor", functools.partial(timed, floor.run, teardown=floor.restore),
                           "lorabind fuse", ours_fuse, reps)
    del floor
    gc.collect()

    # switch A -> B with both sides starting fused with A
    def ours_switch() -> float:
        binding.bind(model, [_fuse(lora_a)], [])
        _drop_file_cache(model)
        return timed(lambda: binding.bind(model, [_fuse(lora_b)], []))

    def theirs_switch() -> float:
        theirs.load_and_fuse(lora_a)
        return timed(lambda: theirs.switch(lora_b), teardown=theirs.unload)

    switch = alternate("diffusers unfuse+unload+load+fuse", theirs_switch, "lorabind re-bind", ours_switch, reps)
    binding.unbind(model)
    switch_exact = _state_equal(ours_t, base_state)

    def ours_strength() -> float:
        binding.bind(model, [_fuse(lora_a, 1.0)], [])
        return timed(lambda: binding.bind(model, [_fuse(lora_a, 0.5)], []))

    def theirs_strength() -> float:
        theirs.load_and_fuse(lora_a, 1.0)
        return timed(lambda: theirs.switch(lora_a, 0.5), teardown=theirs.unload)

    strength = alternate("diffusers re-fuse at 0.5", theirs_strength, "lorabind strength change",
                         ours_strength, reps)
    binding.unbind(model)
    strength_exact = _state_equal(ours_t, base_state)

    return {"fuse": fuse, "floor": floor_pair, "switch": switch, "strength": strength,
            "restore_bit_exact": switch_exact and strength_exact}

