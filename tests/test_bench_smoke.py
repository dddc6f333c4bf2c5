"""Keep the bench scripts from rotting: ``bench/run_all.py --quick`` runs and writes every summary figure.

No timing is asserted here (timing goals live in bench/ as printed ratios); only that each metric was
measured, and the two correctness facts the bench proves along the way.
"""

import json
import math
import pathlib
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow  # runs the whole bench (--quick), about a minute

SUMMARY_KEYS = {
    "fuse_speedup_vs_diffusers", "fuse_vs_floor", "switch_speedup_vs_diffusers",
    "strength_change_speedup_vs_diffusers", "peak_mem_ratio", "peft_switch_ms", "rerun_overhead",
    "help_seconds", "import_seconds", "fuse_real_size_vs_diffusers", "bind_peak_rss_layers", "restore_file_vs_ram",
    "single_file_load_vs_folder", "single_file_peak_rss_ratio",
    "parallel_load_speedup", "strength_step_fused_vs_step", "strength_step_adapter_vs_step",
    "gguf_patched_vs_gguf", "gguf_patched_vs_bf16_fused", "ulysses_2rank_vs_1rank",
    "text_encode_20_tokens_vs_diffusers", "e2e_cold_vs_diffusers", "e2e_strength_vs_diffusers",
    "e2e_switch_vs_diffusers", "e2e_seed_only_vs_diffusers", "rebind_cached_vs_fuse_300",
    "strength_change_real_size_vs_diffusers", "switch_real_size_vs_diffusers",
    "serving_batched_vs_serial", "serving_mixed_lora_vs_serial", "serving_first_step_s", "serving_step_s",
    "tp2_rank_peak_vs_one_process",
    "previews_step_vs_plain", "preview_share_of_step",
}


def test_run_all_quick_writes_every_metric(tmp_path):
    root = pathlib.Path(__file__).resolve().parents[1]
    out = tmp_path / "bench.json"
    proc = subprocess.run([sys.executable, str(root / "bench" / "run_all.py"), "--quick", "--json", str(out)],
                          cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert SUMMARY_KEYS <= set(result)
    assert all(math.isfinite(result[key]) and result[key] > 0 for key in SUMMARY_KEYS)
    assert result["restore_bit_exact"] is True
    assert result["peft_base_weights_untouched"] is True
    # the real-size bind re-read every original from the model file: no RAM backup
    assert result["real_size"]["ram_backups"] == 0 and result["real_size"]["file_backed"] > 0
    assert result["single_file"]["checksums_equal"] is True
    assert result["rebind_unbind_bit_exact"] is True  # the published layout's diffs restored to the bit
    assert result["rebind_single_file"]["ram_backups"] == 0 and result["rebind_single_file"]["file_backed"] > 0
    assert result["parallel_load_same_weights"] is True and result["parallel_load_shards"] > 1
    assert result["parallel_load_same_path"] is (result["parallel_load_workers"] == 1)
    assert result["sequence_parallel"]["max_abs_diff"] == 0.0  # Ulysses moves heads between ranks, no sum reordered
    # every tp=2 rank re-read its shards' originals from the file: no RAM copy (issue 60)
    tp_memory = result["tensor_parallel_memory"]["quick"]
    assert all(r["transformer"]["ram"] == 0 and r["transformer"]["file"] > 0 for r in tp_memory["restore_sources"])
    # both sides of the end-to-end case sampled the same seeded noise on the same sigmas: equal within bf16 rounding
    assert result["end_to_end"]["max_latent_difference"] < 0.1
    assert result["end_to_end"]["max_frame_difference"] < 0.05
    assert {"cpu", "cores", "torch"} <= set(result["machine"]) and result["date"]
    assert set(result["serving"]) == {"serial_one", "batched_one", "serial_four", "batched_four"}
    assert all(setting["prompts"] == 4 for setting in result["serving"].values())
    assert result["previews"]["previews_per_run"] == 4  # every step of the previewed runs was previewed
    summary_lines = [line for line in proc.stdout.splitlines() if line.split(":")[0] in SUMMARY_KEYS]
    assert len(summary_lines) == len(SUMMARY_KEYS)
