"""Issue 28: `lorabind extract` takes single files as base and tuned. Extracting a merged single file against the
single file it was merged from gives the merged LoRA's deltas back at full rank (fp8 bases read as their value),
and the contract `merge` baked into the file travels into the extracted LoRA."""

from __future__ import annotations

import pytest
import torch
from safetensors import safe_open

from lorabind.loaders.dispatch.contract_discovery import discover_contract
from lorabind.loaders.families import family_by_id
from lorabind.loaders.lora.mapping import map_to_model
from lorabind.loaders.lora.reader import clear_lora_cache, read_lora
from lorabind.loaders.offline.single_file_weights import SingleFileWeights
from lorabind.runtime.cli import main
from lorabind.tiny_models.lora_fixtures import WAN22_HIGH

HIGH = "lorabind-tiny/wan2.2_t2v_high_noise_tiny_{}.safetensors"
PREFIX = "transformer."


def _merged(root, precision: str):
    """The high-noise tiny expert at ``precision`` with the lightx2v high-noise LoRA merged in, kept in float32
    so the merged value is the exact float32 sum (nothing rounded away before the extract)."""
    base = root / "diffusion_models" / HIGH.format(precision)
    merged = root / "diffusion_models" / "merged" / f"wan2.2_t2v_high_noise_extract_{precision}.safetensors"
    assert main(["merge", "--model", str(base), "--lora", f"transformer={root / 'loras' / WAN22_HIGH}",
                 "--out", str(merged), "--dtype", "fp32", "--overwrite"]) == 0
    return base, merged


def _extracted(path) -> tuple:
    clear_lora_cache()
    with safe_open(str(path), "pt") as handle:
        return {key: handle.get_tensor(key).double() for key in handle.keys()}, handle.metadata()


def _reconstructed(tensors: dict, key: str):
    """What the extracted file adds to the diffusers parameter ``key``: scale x up @ down, or the stored diff."""
    module, _, param = key.rpartition(".")
    if f"{PREFIX}{module}.lora_A.weight" in tensors and param == "weight":
        down, up = tensors[f"{PREFIX}{module}.lora_A.weight"], tensors[f"{PREFIX}{module}.lora_B.weight"]
        return float(tensors[f"{PREFIX}{module}.alpha"]) / down.shape[0] * (up @ down)
    name = {"weight": f"{module}.diff", "bias": f"{module}.diff_b"}.get(param, f"{key}.diff")
    return tensors.get(PREFIX + name)


@pytest.mark.parametrize("precision", ["bf16", "fp8_scaled"])
def test_extract_from_a_merged_single_file_gives_the_merged_deltas_back_and_keeps_its_contract(
        single_file_root, tmp_path, precision):
    base, merged = _merged(single_file_root, precision)
    out = tmp_path / f"extracted_{precision}.safetensors"
    assert main(["extract", "--base", str(base), "--tuned", str(merged), "--rank", "64", "--dtype", "fp32",
                 "--out", str(out)]) == 0
    tensors, metadata = _extracted(out)
    before, after = SingleFileWeights(str(base)), SingleFileWeights(str(merged))
    changed = [k for k in sorted(before.keys()) if not torch.equal(before.tensor(k).float(), after.tensor(k))]
    assert len(changed) > 10
    for key in changed:  # every merged delta comes back, low-rank at full rank or whole
        want = after.tensor(key).double() - before.tensor(key).double()
        got = _reconstructed(tensors, key)
        assert got is not None and (got - want).abs().max().item() <= 1e-5, key
    # and the deltas are the LoRA's own: scale x up @ down of the file that was merged
    lora = map_to_model(read_lora(str(single_file_root / "loras" / WAN22_HIGH)), "wan2.2_moe",
                        family_by_id("wan2.2_moe"))
    low_rank = {module: t.low_rank for module, t in lora.targets.items() if t.low_rank is not None}
    assert len(low_rank) > 10
    for module, delta in low_rank.items():
        want = float(delta.scale) * (delta.up.double() @ delta.down.double())
        assert (_reconstructed(tensors, f"{module}.weight") - want).abs().max().item() <= 1e-4, module
    # the contract merge baked into the file travels into the extracted LoRA, and is what discovery reads
    assert metadata["sampling_contract"] == "steps=4, shift=5, cfg=1" and metadata["component"] == "transformer"
    contract = discover_contract(str(out))
    assert (contract.steps, contract.shift, contract.cfg, contract.declared_by) == (4, 5.0, 1.0, "metadata")


def test_fp8_weights_are_read_as_their_value_in_diffusers_names(single_file_root):
    weights = SingleFileWeights(str(single_file_root / "diffusion_models" / HIGH.format("fp8_scaled")))
    with safe_open(weights.source, "pt") as handle:
        value = handle.get_tensor("blocks.0.self_attn.q.weight").float() * \
            handle.get_tensor("blocks.0.self_attn.q.scale_weight").float()
    read = weights.tensor("blocks.0.attn1.to_q.weight")
    assert read.dtype == torch.float32 and torch.equal(read, value)
    assert weights.dtypes["blocks.0.attn1.to_q.weight"] == "F32" and "blocks.0.self_attn.q.weight" not in weights.keys()


def test_a_missing_path_and_a_non_denoiser_file_are_refused_by_name(single_file_root, tmp_path, capsys):
    base = single_file_root / "diffusion_models" / HIGH.format("bf16")
    vae = single_file_root / "vae" / "lorabind-tiny" / "wan_2.1_vae_tiny.safetensors"
    out = tmp_path / "never.safetensors"
    assert main(["extract", "--base", str(base), "--tuned", str(vae), "--out", str(out)]) == 1
    assert "wan_2.1_vae_tiny.safetensors: extract compares denoiser files; this is a vae" in capsys.readouterr().err
    assert main(["extract", "--base", str(base), "--tuned", str(tmp_path / "missing"), "--out", str(out)]) == 1
    assert "no such model folder or file" in capsys.readouterr().err
    assert not out.exists()
