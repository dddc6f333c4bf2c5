"""Run every benchmark and print side-by-side ratios (issue 7); keep and compare the results (issue 33).

    python bench/run_all.py [--quick] [--json FILE] [--save] [--compare FILE]
    python bench/run_all.py --docs                           # docs/performance table from the latest results/ run
    python bench/run_all.py --device cuda [--json FILE]     # the device figures (bench_cuda), on a GPU

Every figure is a ratio measured in one process, alternating A and B, median of >= 5 repetitions after a
warm-up (``--quick``: tiny sizes, 2 repetitions — a smoke mode that keeps the scripts from rotting).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile

if __package__ in (None, ""):  # run as a script: make `bench` importable as a package
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    __package__ = "bench"

from . import (  # noqa: E402
    bench_end_to_end,
    bench_fuse,
    bench_gguf_patches,
    bench_parallel,
    bench_parallel_load,
    bench_peft,
    bench_previews,
    bench_real_size,
    bench_rebind,
    bench_rerun,
    bench_serving,
    bench_single_file,
    bench_startup,
    bench_strength_schedule,
    bench_text_encoding,
    history,  # noqa: E402
)
from .measure import machine_description, print_table  # noqa: E402
from .workload import FULL, QUICK, write_lora_pair  # noqa: E402


def _memory_in_fresh_process(size_name: str, lora_path: str) -> dict:
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = subprocess.run([sys.executable, "-m", "bench.bench_memory", size_name, lora_path], cwd=repo,
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="tiny sizes, 2 repetitions (smoke mode)")
    parser.add_argument("--json", metavar="FILE", help="also write the summary as one JSON object")
    parser.add_argument("--device", default="cpu", help="cpu (default): the CPU figures; cuda or cuda:N: the "
                        "device figures of bench_cuda (fuse, expert swap, s/step, peak VRAM next to their floors)")
    parser.add_argument("--load-workers", type=int, default=None, metavar="N",
                        help="threads for the parallel side of parallel_load_speedup (default: the loader's own "
                        "rule, parallel_loading.auto_workers)")
    parser.add_argument("--save", action="store_true", help="also keep the figures as bench/results/<date>-<commit>"
                        ".json (commit the quiet-machine run of every landing that touches the engine)")
    parser.add_argument("--compare", metavar="FILE", help="print each figure beside FILE's (a saved run or a --json "
                        "file) and flag those worse by more than the noise")
    parser.add_argument("--docs", action="store_true", help="only rewrite docs/performance/benchmarks.md's table from "
                        "the latest run in bench/results/ (runs no benchmark)")
    args = parser.parse_args(argv)
    if args.docs:
        latest = history.latest()
        history.write_table(latest)
        history.write_headline(latest)
        print(f"{history.PERFORMANCE_PAGE} table and {history.README}'s headline figures rewritten from {latest}")
        return 0

    import torch

    if args.device != "cpu":
        return _device_figures(args.device, args.json)

    size, size_name = (QUICK, "quick") if args.quick else (FULL, "full")
    reps = 2 if args.quick else 5
    print(f"lorabind bench ({size_name}): {size}")
    with tempfile.TemporaryDirectory(prefix="lorabind-bench-") as tmp:
        lora_a, lora_b = write_lora_pair(tmp, size)
        fuse = bench_fuse.run(size, lora_a, lora_b, reps)
        memory = _memory_in_fresh_process(size_name, lora_a)
        peft = bench_peft.run(size, tmp, reps)
        schedule = bench_strength_schedule.run(size, tmp, reps)
        rerun = bench_rerun.run(tmp, reps if args.quick else bench_rerun.FULL_RERUNS)
        real = bench_real_size.run(tmp, args.quick, 2 if args.quick else 3)
        rebind = bench_rebind.run(tmp, args.quick, 2 if args.quick else 3)  # reuses bench_real_size's model folder
        single_file = bench_single_file.run(size_name, tmp, 1 if args.quick else 3)
        loading = bench_parallel_load.run(tmp, args.quick, reps, workers=args.load_workers)
        end_to_end = bench_end_to_end.run(tmp, args.quick)
        serving = bench_serving.run(tmp, args.quick)
        previews = bench_previews.run(tmp, args.quick, reps)  # on bench_serving's model folder
    gguf = bench_gguf_patches.run(size, reps)
    startup = bench_startup.run(reps)
    sequence_split = bench_parallel.run(args.quick, reps)
    tp_memory = bench_parallel.run_memory(args.quick)
    text_encoding = bench_text_encoding.run(args.quick, reps)

    summary = {
        "fuse_speedup_vs_diffusers": fuse["fuse"].ratio,
        "fuse_vs_floor": fuse["floor"].b / fuse["floor"].a,
        "switch_speedup_vs_diffusers": fuse["switch"].ratio,
        "strength_change_speedup_vs_diffusers": fuse["strength"].ratio,
        "peak_mem_ratio": memory["peak_mem_ratio"],
        "peft_switch_ms": peft["switch_ms"],
        "strength_step_fused_vs_step": schedule["strength_step_fused_vs_step"],
        "strength_step_adapter_vs_step": schedule["strength_step_adapter_vs_step"],
        "rerun_overhead": rerun["rerun_overhead"],
        "rerun_runtime_overhead": rerun["runtime_overhead"],
        "help_seconds": startup["help_seconds"],
        "import_seconds": startup["import_seconds"],
        "fuse_real_size_vs_diffusers": real["fuse"].ratio,
        "bind_peak_rss_layers": real["rss"]["bind_peak_rss_layers"],
        "restore_file_vs_ram": real["restore"].b / real["restore"].a,
        "rebind_cached_vs_fuse_300": rebind["rebind"].b / rebind["rebind"].a,
        "strength_change_real_size_vs_diffusers": rebind["strength"].ratio,
        "switch_real_size_vs_diffusers": rebind["switch"].ratio,
        "single_file_load_vs_folder": single_file["single_file_load_vs_folder"],
        "single_file_peak_rss_ratio": single_file["single_file_peak_rss_ratio"],
        "parallel_load_speedup": loading["pair"].ratio,
        "gguf_patched_vs_gguf": gguf["gguf_patched_vs_gguf"],
        "gguf_patched_vs_bf16_fused": gguf["gguf_patched_vs_bf16_fused"],
        "ulysses_2rank_vs_1rank": sequence_split["ulysses_2rank_vs_1rank"],
        "tp2_rank_peak_vs_one_process": tp_memory["tp2_rank_peak_vs_one_process"],
        "text_encode_20_tokens_vs_diffusers": text_encoding["text_encode_20_tokens_vs_diffusers"],
        **{f"e2e_{scenario}_vs_diffusers": end_to_end[f"e2e_{scenario}_vs_diffusers"]
           for scenario in bench_end_to_end.SCENARIOS},
        **{name: serving[name] for name in bench_serving.FIGURES},
        **{name: previews[name] for name in bench_previews.FIGURES},
    }
    rows = [("metric", "A", "B", "ratio")]
    for key in ("fuse", "floor", "switch", "strength"):
        pair = fuse[key]
        rows.append((f"{pair.name_a} vs {pair.name_b}", f"{pair.a * 1000:.1f} ms", f"{pair.b * 1000:.1f} ms",
                     f"{pair.ratio:.2f}x"))
    print_table("Fuse / switch (median seconds, A vs B)", rows)
    print_table("Memory", [("peak extra RSS during fuse", f"{memory['peak_extra_bytes'] / 2**20:.1f} MiB"),
                           ("backups + largest layer", f"{memory['peak_budget_bytes'] / 2**20:.1f} MiB"),
                           ("restore bit-exact after switch", str(fuse["restore_bit_exact"]))])
    real_rows = [("metric", "A", "B", "ratio")]
    for key in ("fuse", "restore"):
        pair = real[key]
        real_rows.append((f"{pair.name_a} vs {pair.name_b}", f"{pair.a * 1000:.1f} ms", f"{pair.b * 1000:.1f} ms",
                          f"{pair.ratio:.2f}x"))
    real_rows.append(("peak extra RSS of a bind / largest layer",
                      f"{real['rss']['peak_extra_bytes'] / 2**20:.1f} MiB",
                      f"{real['rss']['largest_layer_bytes'] / 2**20:.1f} MiB",
                      f"{real['rss']['bind_peak_rss_layers']:.2f}"))
    print_table(f"Real size: {real['label']}, rank-64 LoRA in the published layout "
                f"(originals re-read from the file: {real['rss']['file_backed']} tensors, "
                f"{real['rss']['ram_backups']} RAM backups)", real_rows)
    print_table(f"Re-bind at real size: {rebind['label']}, published layout (median seconds, A vs B)",
                [(f"{p.name_a} vs {p.name_b}", f"{p.a:.3f}", f"{p.b:.3f}", f"{p.a / p.b:.2f}x")
                 for p in (rebind["rebind"], rebind["strength"], rebind["switch"])]
                + [("unbind bit-exact", str(rebind["unbind_bit_exact"]), "", "")]
                + [(f"single file: {k}", f"{v:.3f}" if isinstance(v, float) else str(v), "", "")
                   for k, v in bench_rebind.single_file_row(rebind).items()])
    print_table("PEFT activation switch", [(k, v) for k, v in peft.items()])
    print_table("Strength schedule: one per-step strength change vs one denoiser step (median ms)",
                [(k, f"{v:.3f}") for k, v in schedule.items()])
    print_table("Re-run (seed change only)", [(k, v) for k, v in rerun.items()])
    print_table("Cold start (seconds)", [(k, f"{v:.3f}") for k, v in startup.items()])
    print_table("Single file vs diffusers folder (Wan transformer, fresh process each)",
                [(k, f"{v:.3f}" if isinstance(v, float) else str(v)) for k, v in single_file.items()])
    load_pair = loading["pair"]
    print_table(f"Sharded folder load ({loading['parameters'] / 1e6:.1f} M parameters in {loading['shards']} shards, "
                "median seconds)",
                [(load_pair.name_a, f"{load_pair.a:.3f}"), (load_pair.name_b, f"{load_pair.b:.3f}"),
                 ("same weights either way", str(loading["same_weights"])), ("worker rule", loading["rule"])]
                + ([("note", "the rule picked 1 worker here: both sides ran the sequential loader, so "
                     "parallel_load_speedup is the noise of identical interleaved runs")] if loading["same_path"]
                   else []))
    print_table(f"LoRA on GGUF: one layer's forward ({gguf['layer']}, {gguf['tokens']} tokens, bf16 compute, "
                "median ms)", [(k, f"{v:.3f}") for k, v in gguf.items() if k.endswith(("_ms", "_vs_gguf",
                                                                                          "_vs_bf16_fused"))])
    print_table(f"Sequence parallelism on CPU: one tiny Wan forward ({sequence_split['tokens']} tokens, "
                f"{sequence_split['blocks']} blocks), ulysses=2 on 2 gloo ranks x 1 thread vs 1 rank x 2 threads "
                "(rank 0's median ms)", [(k, f"{v:.3g}" if isinstance(v, float) else str(v)) for k, v in sequence_split.items()])
    bench_parallel.print_memory(tp_memory)
    encode_pair = text_encoding["pair"]
    print_table(f"Text encoding, a {bench_text_encoding.PROMPT_TOKENS}-token prompt, UMT5-XXL width "
                f"({text_encoding['width']}, {text_encoding['layers']} of 24 layers, bf16; median ms)",
                [(encode_pair.name_a, f"{encode_pair.a * 1000:.1f}"), (encode_pair.name_b, f"{encode_pair.b * 1000:.1f}"),
                 ("largest difference / largest value",
                  f"{text_encoding['max_abs_difference']:.3g} / {text_encoding['max_abs_value']:.3g}")])
    e2e_seconds, e2e_denoise = end_to_end["seconds"], end_to_end["denoise_seconds"]
    print_table(f"End to end through the runtime vs WanPipeline ({end_to_end['label']}; seconds, one run each)",
                [("scenario", "diffusers (of it denoising)", "lorabind (of it denoising)", "ratio")]
                + [(scenario, *(f"{e2e_seconds[scenario][side]:.2f} ({e2e_denoise[scenario][side]:.2f})"
                                for side in ("diffusers", "lorabind")),
                    f"{end_to_end[f'e2e_{scenario}_vs_diffusers']:.2f}x") for scenario in bench_end_to_end.SCENARIOS]
                + [("largest difference, frames / latents", f"{end_to_end['max_frame_difference']:.3g}",
                    f"{end_to_end['max_latent_difference']:.3g}", "")])
    bench_serving.print_report(serving, print_table)
    bench_previews.print_report(previews, print_table)

    print("\nsummary")
    notes = {"parallel_load_speedup": "(1 worker chosen: same loader on both sides, noise around 1)"
             if loading["same_path"] else ""}
    same_code = {"parallel_load_same_path": loading["same_path"]}
    for name, value in summary.items():
        print(f"{name}: {value:.3f} {history.verdict(name, value, same_code)} {notes.get(name, '')}".rstrip())
    if args.compare:
        print(f"\ncompared with {args.compare}")
        print("\n".join(history.compare(summary, args.compare)))
    if args.save:
        saved = history.save(history.record(summary, {"machine": machine_description(), "size": size_name,
                                                       "parallel_load_workers": loading["workers"],
                                                       **same_code}))
        print(f"saved {saved}")
    if args.json:
        payload = dict(summary, restore_bit_exact=fuse["restore_bit_exact"], peft_base_weights_untouched=peft[
            "base_weights_untouched"],
            real_size={"fuse_ms": {"diffusers": real["fuse"].a * 1000, "lorabind": real["fuse"].b * 1000},
                       "restore_ms": {"ram_backups": real["restore"].a * 1000, "file": real["restore"].b * 1000},
                       **real["rss"]},
            single_file=single_file, rebind_unbind_bit_exact=rebind["unbind_bit_exact"],
            rebind_single_file=bench_rebind.single_file_row(rebind),
            end_to_end={k: v for k, v in end_to_end.items() if not k.startswith("e2e_")},
            serving=serving["settings"],
            previews={k: v for k, v in previews.items() if k not in bench_previews.FIGURES},
            peft_switch_ms_by_size={k: v for k, v in peft.items() if k.startswith("switch_ms_")},
            parallel_load_workers=loading["workers"], parallel_load_shards=loading["shards"],
            parallel_load_same_path=loading["same_path"],
            parallel_load_same_weights=loading["same_weights"], sequence_parallel=sequence_split,
            tensor_parallel_memory=bench_parallel.memory_summary(tp_memory), machine=machine_description(), size=size_name,
            commit=history.commit(), load_average=list(os.getloadavg()),
            date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            torch_threads=torch.get_num_threads())
        with open(args.json, "w") as fh:
            json.dump(payload, fh, indent=2)
        print(f"wrote {args.json}")
    return 0


def _device_figures(device: str, json_path) -> int:
    """``--device cuda``: the bench_cuda entries on the real 14B configuration; a clean exit without CUDA."""
    import torch

    from . import bench_cuda

    if not torch.cuda.is_available():
        print(f"--device {device}: this torch ({torch.__version__}) sees no CUDA device; the device figures are "
              "skipped (run them on a GPU machine)")
        return 0
    result = bench_cuda.run(bench_cuda.REAL_CONFIGS / "wan2.2-t2v-a14b" / "transformer", device)
    bench_cuda.print_report(result)
    summary = {k: v for k, v in result.items() if k != "details"}
    summary.update(bench_parallel.run_device())  # ulysses_speedup_<N>gpu; nothing (and a line why) under 2 GPUs
    print("\nsummary")
    for name, value in summary.items():
        print(f"{name}: {value:.3f}")
    if json_path:
        with open(json_path, "w") as fh:
            json.dump(dict(summary, machine=machine_description(), device=device, details=result["details"],
                           date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")),
                      fh, indent=2, default=str)
        print(f"wrote {json_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
