"""The tp=2 rank run on a real loaded model: the tiny Wan2.1 folder through ``load_model``, the LightX2V-style
fixture LoRA (pairs, bias diffs, norm diffs, ``diff_m``) through ``bind``, and the fixture PEFT adapter."""

from __future__ import annotations

from pathlib import Path

import torch

from lorabind.loaders.binding.bind import bind, binding_state, unbind
from lorabind.loaders.handles import AdapterSpec, FuseSpec
from lorabind.loaders.models.store import load_model
from lorabind.loaders.models.tensor_parallel import apply_tensor_parallel
from lorabind.tiny_models.lora_fixtures import PEFT_FOLDER, WAN21_DISTILL
from lorabind.tiny_models.wan import WAN21_NAME


def run_loaded(rank: int, world_size: int, models_root: str) -> dict:
    """Whole fuse, then split, then the same fuse on the shards: each rank's shard against the whole fuse's
    rows/columns, the restore, the accounting of both binds, and the PEFT refusal."""
    root = Path(models_root)
    model = load_model(str(root / "diffusers" / WAN21_NAME), name=WAN21_NAME)
    fuse = FuseSpec(path=str(root / "loras" / WAN21_DISTILL), strength=0.8, component="transformer", name="distill")
    whole_report = bind(model, [fuse], [])
    patcher = binding_state(model).patcher
    names = sorted(pid.split(":", 1)[1] for pid in patcher.patched)
    transformer = model.components["transformer"]
    whole = {n: transformer.get_parameter(n).detach().clone() for n in names}
    unbind(model)
    apply_tensor_parallel(model, world_size)
    before = {n: _local(transformer.get_parameter(n)).clone() for n in names}
    split_report = bind(model, [fuse], [])
    fused_equal, placements = {}, {}
    for n in names:
        param = transformer.get_parameter(n)
        placements[n] = str(getattr(param, "placements", "plain"))
        local = _local(param)
        fused_equal[n] = torch.equal(local, rank_part(whole[n], placements[n], rank, local))
    unbind(model)
    restored = all(torch.equal(_local(transformer.get_parameter(n)), before[n]) for n in names)
    peft = AdapterSpec(path=str(root / "loras" / PEFT_FOLDER), scale=1.0, component="transformer", name="style")
    try:
        bind(model, [], [peft])
        peft_message = "no error"
    except Exception as exc:
        peft_message = f"{type(exc).__name__}: {exc}"
    return {"fused_equal": fused_equal, "placements": placements, "restored": restored, "peft": peft_message,
            "accounting": (whole_report.fuses[0]["accounting"], split_report.fuses[0]["accounting"]),
            "restore_sources": (whole_report.restore_sources, split_report.restore_sources)}


def _local(param) -> torch.Tensor:
    return param.to_local() if hasattr(param, "placements") else param.detach()


def rank_part(whole: torch.Tensor, placement: str, rank: int, local: torch.Tensor) -> torch.Tensor:
    """The rows (Shard(dim=0)) or columns (Shard(dim=1)) of the unsharded tensor that ``rank`` holds."""
    if "dim=0" in placement:
        return whole[rank * local.shape[0]:(rank + 1) * local.shape[0]]
    if "dim=1" in placement:
        return whole[:, rank * local.shape[1]:(rank + 1) * local.shape[1]]
    return whole


def run_denoised(rank: int, world_size: int, models_root: str) -> dict:
    """The tiny Wan2.2 expert pair sampled by the family's own denoise loop (2 steps, cfg 2: one step per expert),
    with the fixture LoRAs fused into both experts, whole and then split over the ranks."""
    from lorabind.loaders.contract_types import SamplingRequest
    from lorabind.loaders.dispatch.contract_discovery import resolve_schedule
    from lorabind.loaders.dispatch.generation_steps import denoise, empty_latent, encode_text
    from lorabind.loaders.handles import ModelHandle
    from lorabind.tiny_models.lora_fixtures import WAN22_HIGH, WAN22_LOW
    from lorabind.tiny_models.wan import WAN22_NAME

    root = Path(models_root)
    model = load_model(str(root / "diffusers" / WAN22_NAME), name=WAN22_NAME)
    fuses = [FuseSpec(path=str(root / "loras" / WAN22_HIGH), strength=1.0, component="transformer", name="high"),
             FuseSpec(path=str(root / "loras" / WAN22_LOW), strength=1.0, component="transformer_2", name="low")]
    positive, negative = encode_text(model, "a cat"), encode_text(model, "blurry")
    latent = empty_latent(model, 32, 32, 5)
    schedule = resolve_schedule(ModelHandle(model), None, None, SamplingRequest(steps=2, cfg=2.0, shift=5.0))
    outputs = {}
    for split in (False, True):
        if split:
            reports = apply_tensor_parallel(model, world_size)
        bind(model, fuses, [])
        outputs[split] = denoise(model, positive, negative, latent, schedule, seed=3).samples
        unbind(model)
    return {"whole": outputs[False], "split": outputs[True], "components": [r.component for r in reports]}
