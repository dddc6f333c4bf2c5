"""Device figures, each next to its floor measured in the same run (issue 11): ``run_all.py --device cuda``.

    python -m bench.bench_cuda [--config wan2.2-t2v-a14b] [--device cuda]

* **fuse**: a rank-64 LoRA on every block linear of one 14B expert (the real Wan2.2 A14B configuration, random
  bf16 weights) fused by our patcher vs diffusers' ``fuse_lora``, vs the HBM floor (read + write every touched
  weight at the device's own copy bandwidth).
* **expert swap**: bringing the low-noise expert up under ``memory=swap_experts`` vs the host->device copy floor
  (the same bytes from pinned memory at the bandwidth measured here).
* **seconds per step**: our sampler vs ``WanPipeline`` at the same settings, both experts resident.
* **peak VRAM**: our ``swap_experts`` plan vs diffusers' ``enable_model_cpu_offload``, denoising the same steps.

Memory on an H200 (141 GB HBM, 128 GiB RAM): two experts are 57 GB; the swap phases keep them on the host
(57 GB pinned) and one on the device. ``--device cpu --config <folder>`` runs every entry on a tiny config (the
smoke test does this) so the code paths cannot rot on machines without a GPU.
"""

from __future__ import annotations

import argparse
import json
import time
import types
from pathlib import Path

import torch

LINEARS = ("attn1.to_q", "attn1.to_k", "attn1.to_v", "attn1.to_out.0", "attn2.to_q", "attn2.to_k", "attn2.to_v",
           "attn2.to_out.0", "ffn.net.0.proj", "ffn.net.2")  # the lightx2v layout: every block linear
RANK = 64


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _seconds(fn, device, reps: int = 1) -> float:
    """Median wall time of ``fn`` over ``reps`` runs, synchronised with the device."""
    times = []
    for _ in range(reps):
        _sync(device)
        start = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


def build_expert(config_dir: Path, device, dtype, seed: int):
    """A Wan transformer from ``config_dir/config.json`` with random weights, built directly on ``device``."""
    from diffusers import WanTransformer3DModel

    config = json.loads((config_dir / "config.json").read_text())
    with torch.device("meta"):
        module = WanTransformer3DModel.from_config(config).to(dtype)  # never a float32 copy of 14B parameters
    module = module.to_empty(device=device)
    generator = torch.Generator(device).manual_seed(seed)
    with torch.no_grad():
        for tensor in list(module.parameters()) + list(module.buffers()):
            if tensor.is_floating_point():
                tensor.normal_(0.0, 0.02, generator=generator)
    if hasattr(module, "rope"):  # the rotary tables are computed, not learned: rebuild them
        module.rope = type(module.rope)(*_rope_args(module)).to(device)
    return module.eval().requires_grad_(False)


def _rope_args(module):
    config = module.config
    return (config.attention_head_dim, config.patch_size, config.rope_max_seq_len)


def lora_targets(module, device, dtype, rank: int = RANK) -> dict:
    """{module path: TargetPatch} of a random rank-``rank`` LoRA on every block linear."""
    from lorabind.loaders.lora.canonical import LowRankDelta, TargetPatch

    targets = {}
    generator = torch.Generator(device).manual_seed(7)
    for index in range(len(module.blocks)):
        for name in LINEARS:
            path = f"blocks.{index}.{name}"
            weight = module.get_submodule(path).weight
            down = torch.randn(rank, weight.shape[1], device=device, dtype=dtype, generator=generator) * 0.01
            up = torch.randn(weight.shape[0], rank, device=device, dtype=dtype, generator=generator) * 0.01
            targets[path] = TargetPatch(module=path, low_rank=LowRankDelta(down=down, up=up, alpha=None, scale=1.0))
    return targets


def copy_bandwidth(device, nbytes: int = 1 << 30) -> float:
    """Device-to-device copy bandwidth in bytes/s (each copy reads and writes ``nbytes``)."""
    nbytes = max(1 << 20, int(nbytes))
    src = torch.empty(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    seconds = _seconds(lambda: dst.copy_(src), device, reps=5)
    return 2 * nbytes / seconds


def upload_bandwidth(device, nbytes: int = 1 << 31) -> float:
    """Host->device bandwidth in bytes/s from pinned memory (pageable on a CPU-only run)."""
    nbytes = max(1 << 20, int(nbytes))
    host = torch.empty(nbytes, dtype=torch.uint8)
    if device.type == "cuda":
        host = host.pin_memory()
    dst = torch.empty(nbytes, dtype=torch.uint8, device=device)
    return nbytes / _seconds(lambda: dst.copy_(host, non_blocking=True), device, reps=5)


def fuse_entry(expert, device, dtype) -> dict:
    """Our fuse vs diffusers' fuse_lora vs the HBM floor, on one expert."""
    from lorabind.loaders.binding.patching import PatchLayer, WeightPatcher

    targets = lora_targets(expert, device, dtype)
    touched = sum(expert.get_submodule(p).weight.numel() * expert.get_submodule(p).weight.element_size()
                  for p in targets)
    patcher = WeightPatcher({"transformer": expert})
    layer = PatchLayer(key="bench", component="transformer", strength=1.0, targets=targets)
    ours = _seconds(lambda: patcher.apply([layer]), device)
    restore = _seconds(patcher.restore_all, device)
    state = {}
    for path, target in targets.items():
        state[f"{path}.lora_A.weight"] = target.low_rank.down
        state[f"{path}.lora_B.weight"] = target.low_rank.up
    expert.load_lora_adapter(state, adapter_name="bench", prefix=None)
    theirs = _seconds(lambda: expert.fuse_lora(lora_scale=1.0), device)
    expert.unfuse_lora()
    expert.delete_adapters("bench")
    floor = touched / copy_bandwidth(device, min(1 << 30, touched)) * 2  # read + write every touched byte
    return {"touched_bytes": touched, "ours_s": ours, "restore_s": restore, "diffusers_s": theirs,
            "hbm_floor_s": floor}


def _loaded_model(experts: dict, boundary: float):
    from lorabind.loaders.models.store import LoadedModel

    index = {"_class_name": "WanPipeline", "boundary_ratio": boundary,
             **{n: ["diffusers", "WanTransformer3DModel"] for n in experts}}
    return LoadedModel(path="", name="bench", family="wan2.2_moe", pipeline=types.SimpleNamespace(**experts),
                       components=dict(experts), model_index=index)


def _inputs(expert, device, dtype, frames: int, height: int, width: int):
    from lorabind.loaders.handles import ConditioningHandle, LatentHandle

    latent_shape = (1, expert.config.in_channels, (frames - 1) // 4 + 1, height // 8, width // 8)
    embeds = torch.randn(1, 512, expert.config.text_dim) * 0.1
    positive = ConditioningHandle(embeds=embeds, family="wan2.2_moe", text="bench")
    latent = LatentHandle(samples=torch.zeros(latent_shape), family="wan2.2_moe", kind="video")
    return positive, latent


def _schedule(steps: int):
    from lorabind.loaders.contract_types import ResolvedSchedule

    sigmas = tuple(1.0 - i / steps for i in range(steps)) + (0.0,)
    return ResolvedSchedule(sigmas=tuple(sigmas), cfg=1.0, shift=5.0, boundary=None, steps=steps)


def step_entry(experts: dict, device, dtype, steps: int, size: tuple) -> dict:
    """Seconds per step: our sampler vs WanPipeline, same experts, resolution, steps and guidance (cfg 1)."""
    from diffusers import FlowMatchEulerDiscreteScheduler, WanPipeline

    from lorabind.loaders.dispatch.generation_steps import denoise

    boundary = 0.5 + 0.5 / steps  # half the steps on each expert
    model = _loaded_model(experts, boundary)
    positive, latent = _inputs(experts["transformer"], device, dtype, *size)
    ours = _seconds(lambda: denoise(model, positive, None, latent, _schedule(steps), seed=0), device) / steps
    pipe = WanPipeline(tokenizer=None, text_encoder=None, vae=None, scheduler=FlowMatchEulerDiscreteScheduler(),
                       transformer=experts["transformer"], transformer_2=experts["transformer_2"],
                       boundary_ratio=boundary)
    pipe.set_progress_bar_config(disable=True)
    frames, height, width = size
    kwargs = dict(prompt_embeds=positive.embeds.to(device, dtype), height=height, width=width, num_frames=frames,
                  num_inference_steps=steps, guidance_scale=1.0, output_type="latent")
    theirs = _seconds(lambda: pipe(**kwargs), device) / steps
    return {"ours_s_per_step": ours, "diffusers_s_per_step": theirs, "pipeline": pipe, "kwargs": kwargs}


def swap_and_peak_entry(experts: dict, pipe, kwargs: dict, device, steps: int, size: tuple) -> dict:
    """diffusers' model offload peak, then our swap plan: the swap time vs the upload floor, and its peak."""
    from lorabind.loaders.dispatch.generation_steps import denoise
    from lorabind.loaders.families import component_roles
    from lorabind.loaders.placement import MemoryPlan
    from lorabind.loaders.placement.apply_plan import ModelPlacement

    def peak(fn) -> int:
        if device.type != "cuda":
            fn()
            return 0
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
        fn()
        return torch.cuda.max_memory_allocated(device)

    pipe.enable_model_cpu_offload(device=device)
    diffusers_peak = peak(lambda: pipe(**kwargs))
    pipe.remove_all_hooks()
    for expert in experts.values():
        expert.to("cpu")
    plan = MemoryPlan(memory="swap_experts", resident=("transformer",), placement={n: "swap" for n in experts},
                      prefetch=False)
    model = _loaded_model(experts, 0.5 + 0.5 / steps)
    model.placement = ModelPlacement(dict(experts), plan, device, component_roles(model.model_index))
    model.placement.apply()
    model.placement.activate("transformer")
    nbytes = model.placement.staged["transformer_2"].nbytes
    swap = _seconds(lambda: model.placement.activate("transformer_2"), device)
    floor = nbytes / upload_bandwidth(device, min(1 << 31, nbytes))
    positive, latent = _inputs(experts["transformer"], device, None, *size)
    ours_peak = peak(lambda: denoise(model, positive, None, latent, _schedule(steps), seed=0))
    model.placement.remove()
    return {"swap_s": swap, "upload_floor_s": floor, "expert_bytes": nbytes, "ours_peak_bytes": ours_peak,
            "diffusers_offload_peak_bytes": diffusers_peak, "swaps": model.placement.stats.swaps}


def run(config_dir: Path, device, *, steps: int = 4, size: tuple = (17, 480, 832)) -> dict:
    device = torch.device(device)
    dtype = torch.bfloat16
    experts = {"transformer": build_expert(config_dir, device, dtype, seed=1)}
    fuse = fuse_entry(experts["transformer"], device, dtype)
    experts["transformer_2"] = build_expert(config_dir, device, dtype, seed=2)
    step = step_entry(experts, device, dtype, steps, size)
    swap = swap_and_peak_entry(experts, step.pop("pipeline"), step.pop("kwargs"), device, steps, size)
    return {
        "fuse_14b_vs_diffusers": fuse["diffusers_s"] / fuse["ours_s"],
        "fuse_14b_vs_hbm_floor": fuse["ours_s"] / fuse["hbm_floor_s"],
        "expert_swap_vs_upload_floor": swap["swap_s"] / swap["upload_floor_s"],
        "seconds_per_step_vs_diffusers": step["ours_s_per_step"] / step["diffusers_s_per_step"],
        "peak_vram_vs_diffusers_offload": (swap["ours_peak_bytes"] / swap["diffusers_offload_peak_bytes"]
                                           if swap["diffusers_offload_peak_bytes"] else float("nan")),
        "details": {"fuse": fuse, "step": step, "swap": swap, "steps": steps, "size": list(size),
                    "config": config_dir.name, "device": str(device)},
    }


def print_report(result: dict) -> None:
    from .measure import print_table

    fuse, step, swap = (result["details"][k] for k in ("fuse", "step", "swap"))
    gb = 1e9
    print_table("Device figures (each next to its floor or the diffusers equivalent)", [
        ("fuse one expert: ours", f"{fuse['ours_s']:.3f} s", "diffusers fuse_lora", f"{fuse['diffusers_s']:.3f} s"),
        ("fuse one expert: ours", f"{fuse['ours_s']:.3f} s", "HBM floor", f"{fuse['hbm_floor_s']:.3f} s"),
        ("expert swap", f"{swap['swap_s']:.3f} s", "host->device floor", f"{swap['upload_floor_s']:.3f} s"),
        ("seconds per step: ours", f"{step['ours_s_per_step']:.3f}", "WanPipeline",
         f"{step['diffusers_s_per_step']:.3f}"),
        ("peak VRAM swap_experts", f"{swap['ours_peak_bytes'] / gb:.1f} GB", "diffusers model offload",
         f"{swap['diffusers_offload_peak_bytes'] / gb:.1f} GB"),
    ])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--config", default="wan2.2-t2v-a14b", help="a shipped real configuration or a folder "
                        "holding transformer/config.json")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--size", default="17x480x832", help="FRAMESxHEIGHTxWIDTH")
    args = parser.parse_args(argv)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print(f"--device {args.device}: this torch ({torch.__version__}) sees no CUDA device; nothing measured")
        return 0
    from lorabind.loaders.io.shipped_configs import shipped_model_folder

    folder = Path(args.config) if Path(args.config).is_dir() else shipped_model_folder(args.config)
    if folder is None:
        parser.error(f"--config {args.config}: neither a folder nor a shipped real configuration")
    result = run(folder / "transformer", args.device, steps=args.steps,
                 size=tuple(int(x) for x in args.size.split("x")))
    print_report(result)
    print(json.dumps({k: v for k, v in result.items() if k != "details"}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
