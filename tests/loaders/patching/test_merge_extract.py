"""`lorabind merge` then `lorabind extract` on the tiny Wan2.2 folder: exact merge, lossless round trip, refusals."""

from __future__ import annotations

import hashlib
import json
import os

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from lorabind.loaders.binding.bind import bind
from lorabind.loaders.families import family_by_id
from lorabind.loaders.handles import FuseSpec
from lorabind.loaders.io.safe_output import MARKER_FILE
from lorabind.loaders.lora import account, clear_lora_cache, map_to_model, read_lora
from lorabind.loaders.models.store import LoadedModel
from lorabind.loaders.offline.extraction import low_rank_factors
from lorabind.runtime.cli import main
from patching_helpers import expected_value, lightx2v_lora, write_component_folder

COMPONENT = "transformer_2"


@pytest.fixture(scope="session")
def tiny_wan22_folder(tmp_path_factory):
    from lorabind.tiny_models.wan import build_tiny_wan22

    return str(build_tiny_wan22(tmp_path_factory.mktemp("models")))


def file_hashes(folder):
    out = {}
    for root, _, files in os.walk(folder):
        for name in files:
            path = os.path.join(root, name)
            out[os.path.relpath(path, folder)] = hashlib.sha256(open(path, "rb").read()).hexdigest()
    return out


def component_state(folder, component=COMPONENT):
    return load_file(os.path.join(folder, component, "diffusion_pytorch_model.safetensors"))


def load_transformer(folder, component=COMPONENT):
    from diffusers import WanTransformer3DModel

    return WanTransformer3DModel.from_pretrained(folder, subfolder=component, local_files_only=True).eval()


@pytest.fixture(scope="session")
def merged(tiny_wan22_folder, tmp_path_factory):
    """The tiny model merged with a LightX2V-style LoRA at strength 0.8: low-rank pairs (alpha and not), diff_b,
    norm diffs, a full-rank diff, modulation (diff_m), global layers."""
    work = tmp_path_factory.mktemp("merge")
    tensors, expected = lightx2v_lora(load_transformer(tiny_wan22_folder), seed=5, full=True)
    lora = str(work / "wan22_style.safetensors")
    save_file(tensors, lora)
    source_before = file_hashes(tiny_wan22_folder)
    out = str(work / "merged")
    rc = main(["merge", "--model", tiny_wan22_folder, "--lora", f"{lora}:0.8", "--component", COMPONENT,
               "--out", out])
    return {"rc": rc, "out": out, "lora": lora, "expected": expected, "source_before": source_before, "work": work}


def test_merge_writes_a_complete_folder_with_exact_fused_weights(tiny_wan22_folder, merged):
    assert merged["rc"] == 0
    out = merged["out"]
    # the source is untouched; every other file is copied byte for byte; same files in the new folder
    assert file_hashes(tiny_wan22_folder) == merged["source_before"]
    after = file_hashes(out)
    assert set(after) == set(merged["source_before"])
    changed = {name for name in after if after[name] != merged["source_before"][name]}
    # (and the output marker: the source was written by build-tiny, the copy by merge)
    assert changed == {f"{COMPONENT}/diffusion_pytorch_model.safetensors", "model_index.json", MARKER_FILE}
    # model_index.json gains only what was baked in: file name, strength and content hash, no local path
    with open(os.path.join(tiny_wan22_folder, "model_index.json"), encoding="utf-8") as handle:
        source_index = json.load(handle)
    with open(os.path.join(out, "model_index.json"), encoding="utf-8") as handle:
        out_index = json.load(handle)
    baked = out_index.pop("_lorabind")
    assert out_index == source_index
    lora_hash = hashlib.sha256(open(merged["lora"], "rb").read()).hexdigest()
    assert baked["fused"] == [{"name": "wan22_style.safetensors", "component": COMPONENT, "strength": 0.8,
                               "sha256": lora_hash}]
    assert baked["contracts"] == []  # this file declares none
    base, fused = component_state(tiny_wan22_folder), component_state(out)
    for name, spec in merged["expected"].items():
        assert (fused[name].double() - expected_value(base[name], spec, 0.8)).abs().max().item() <= 1e-6
    assert all(torch.equal(base[k], fused[k]) for k in base if k not in merged["expected"])
    # and the merged folder loads as a normal diffusers pipeline, offline
    from diffusers import DiffusionPipeline

    pipe = DiffusionPipeline.from_pretrained(out, local_files_only=True)
    assert torch.equal(pipe.transformer_2.state_dict()["blocks.0.attn1.to_q.weight"],
                       fused["blocks.0.attn1.to_q.weight"])


def test_merge_report_says_what_its_counts_count(tiny_wan22_folder, merged, tmp_path, capsys):
    """Every tensor of the component is written; the report splits them into fused by the LoRA and copied."""
    out = tmp_path / "again"
    assert main(["merge", "--model", tiny_wan22_folder, "--lora", f"{merged['lora']}:0.8", "--component",
                 COMPONENT, "--out", str(out)]) == 0
    first_line, report_json = capsys.readouterr().out.split("\n", 1)
    assert first_line == f"lorabind merge: wrote {out}"
    report = json.loads(report_json)
    assert report["tensors_fused"] == len(merged["expected"])
    assert report["tensors_copied_unchanged"] == len(component_state(tiny_wan22_folder)) - len(merged["expected"])


@pytest.mark.slow
@pytest.mark.parametrize("alpha", [None, 16.0])
def test_extract_at_full_rank_reproduces_the_merged_deltas(tiny_wan22_folder, merged, alpha):
    assert merged["rc"] == 0
    out_file = str(merged["work"] / f"extracted_{alpha}.safetensors")
    args = ["extract", "--base", tiny_wan22_folder, "--tuned", merged["out"], "--rank", "64",
            "--component", COMPONENT, "--out", out_file, "--dtype", "fp32"]
    if alpha is not None:
        args += ["--alpha", str(alpha)]
    assert main(args) == 0
    clear_lora_cache()
    lora = read_lora(out_file)
    base_module = load_transformer(tiny_wan22_folder)
    acc = account(map_to_model(lora, "wan2.2_moe", family_by_id("wan2.2_moe")), base_module, component=COMPONENT)
    base = component_state(tiny_wan22_folder)
    # every merged delta comes back: low-rank on 2-D weights (rank capped at min(out, in)), diffs on the rest
    assert {f"{m}.weight" for m, t in acc.applied.items() if t.low_rank is not None} | {
        f"{m}.{p}" for m, t in acc.applied.items() for p in t.param_diffs} == set(merged["expected"])
    for name, spec in merged["expected"].items():
        module, param = name.rsplit(".", 1)
        target = acc.applied[module]
        want = expected_value(base[name], spec, 0.8) - base[name].double()
        if param == "weight" and base[name].dim() == 2:
            lr = target.low_rank
            assert lr.rank == min(base[name].shape)
            got = lr.scale * (lr.up.double() @ lr.down.double())
        else:
            got = target.param_diffs[param].double()
        assert (got - want).abs().max().item() <= 1e-5
    # fusing the extracted LoRA into the base gives the merged weights back
    model = LoadedModel(path=tiny_wan22_folder, name="tiny", family="wan2.2_moe", pipeline=None,
                        components={COMPONENT: base_module})
    bind(model, [FuseSpec(out_file, 1.0, COMPONENT)], [])
    merged_state = component_state(merged["out"])
    rebuilt = base_module.state_dict()
    assert max((rebuilt[k].double() - merged_state[k].double()).abs().max().item() for k in merged["expected"]) <= 1e-5


def test_low_rank_factors_truncate_to_the_best_rank_r_approximation():
    g = torch.Generator().manual_seed(3)
    exact = torch.randn(20, 3, generator=g) @ torch.randn(3, 12, generator=g)
    down, up, used, error = low_rank_factors(exact, 8, alpha=4.0)
    assert used == 8 and (4.0 / 8 * up @ down - exact).abs().max().item() < 1e-5
    noisy = exact + 0.01 * torch.randn(20, 12, generator=g)
    down, up, used, error = low_rank_factors(noisy, 3, alpha=None)
    s = torch.linalg.svdvals(noisy)
    # Eckart–Young: the spectral error of the best rank-3 approximation is the 4th singular value
    assert abs(torch.linalg.matrix_norm(noisy - up @ down, ord=2).item() - s[3].item()) < 1e-4
    assert error > 0 and down.shape == (3, 12) and up.shape == (20, 3)


def fake_component(root, name, tensors):
    return write_component_folder(root, name, tensors)


def test_extract_refuses_mismatched_models_and_writes_nothing(tmp_path, capsys):
    base = fake_component(tmp_path, "base", {"a.weight": torch.zeros(4, 4), "b.weight": torch.zeros(3, 3)})
    wrong_shape = fake_component(tmp_path, "shape", {"a.weight": torch.ones(4, 5), "b.weight": torch.ones(3, 3)})
    missing = fake_component(tmp_path, "missing", {"a.weight": torch.ones(4, 4)})
    out = tmp_path / "out.safetensors"
    assert main(["extract", "--base", base, "--tuned", wrong_shape, "--rank", "2", "--out", str(out)]) == 1
    assert "shape mismatch on 'a.weight': base [4, 4], tuned [4, 5]" in capsys.readouterr().err
    assert main(["extract", "--base", base, "--tuned", missing, "--rank", "2", "--out", str(out)]) == 1
    assert "missing in the tuned model (1): b.weight" in capsys.readouterr().err
    assert main(["extract", "--base", base, "--tuned", base, "--rank", "2", "--out", str(out)]) == 1
    assert "nothing to extract" in capsys.readouterr().err
    assert sorted(os.listdir(tmp_path)) == ["base", "missing", "shape"]  # no output, no temporary file


def test_merge_refusals(tiny_wan22_folder, merged, tmp_path, capsys):
    assert main(["merge", "--model", tiny_wan22_folder, "--lora", merged["lora"], "--component", COMPONENT,
                 "--out", merged["out"]]) == 1
    assert "already exists" in capsys.readouterr().err
    out = tmp_path / "never"
    assert main(["merge", "--model", tiny_wan22_folder, "--lora", merged["lora"], "--component", "transformer_9",
                 "--out", str(out)]) == 1
    assert "no component 'transformer_9'" in capsys.readouterr().err
    bad = tmp_path / "bad.safetensors"
    save_file({"diffusion_model.blocks.0.self_attn.q.lora_down.weight": torch.zeros(2, 7),
               "diffusion_model.blocks.0.self_attn.q.lora_up.weight": torch.zeros(24, 2)}, str(bad))
    assert main(["merge", "--model", tiny_wan22_folder, "--lora", f"{bad}:0.5", "--component", COMPONENT,
                 "--out", str(out)]) == 1
    assert "bad.safetensors" in capsys.readouterr().err
    assert not out.exists() and not [f for f in os.listdir(tmp_path) if f.startswith(".lorabind-output-")]
    with safe_open(os.path.join(tiny_wan22_folder, COMPONENT, "diffusion_pytorch_model.safetensors"), "pt") as f:
        assert "blocks.0.attn1.to_q.weight" in f.keys()


def test_merge_stacks_loras_in_fp32_and_casts_once(tiny_wan22_folder, tmp_path):
    module = load_transformer(tiny_wan22_folder, "transformer")
    first, expected_first = lightx2v_lora(module, seed=7)
    second, expected_second = lightx2v_lora(module, seed=8, rank=2, alpha=1.0)
    paths = [str(tmp_path / "first.safetensors"), str(tmp_path / "second.safetensors")]
    save_file(first, paths[0])
    save_file(second, paths[1])
    out = str(tmp_path / "stacked")
    assert main(["merge", "--model", tiny_wan22_folder, "--lora", f"{paths[0]}:0.5", "--lora", f"{paths[1]}:-1",
                 "--out", out, "--dtype", "bf16"]) == 0
    base, fused = component_state(tiny_wan22_folder, "transformer"), component_state(out, "transformer")
    assert {t.dtype for t in fused.values() if t.is_floating_point()} == {torch.bfloat16}
    for name in expected_first:
        exact = (expected_value(base[name], expected_first[name], 0.5)
                 + expected_value(base[name], expected_second[name], -1.0) - base[name].double())
        # one rounding of the exact sum to bf16: within half a bf16 step (relative 2^-9), never a double rounding
        assert bool(((fused[name].double() - exact).abs() <= exact.abs() * 2.0 ** -8 + 1e-30).all()), name
    assert file_hashes(os.path.join(out, COMPONENT)) == file_hashes(os.path.join(tiny_wan22_folder, COMPONENT))


def test_merge_never_loads_the_model_and_keeps_shards(tiny_wan22_folder, tmp_path, monkeypatch):
    """The component is built on the meta device and its files streamed shard by shard: loading it (and the
    patcher's restore backups) would hold the model several times. A sharded component keeps its shard names,
    keys and index, and the fused values are exact."""
    from diffusers import ModelMixin

    folder = tmp_path / "sharded"
    folder.mkdir()
    for name in os.listdir(tiny_wan22_folder):  # the other components as symlinks (HF-cache style)
        if name != COMPONENT:
            os.symlink(os.path.join(tiny_wan22_folder, name), folder / name)
    module = load_transformer(tiny_wan22_folder)
    module.save_pretrained(str(folder / COMPONENT), max_shard_size="40KB")
    shards = sorted(f for f in os.listdir(folder / COMPONENT) if f.endswith(".safetensors"))
    assert len(shards) > 1
    tensors, expected = lightx2v_lora(module, seed=11, full=True)
    lora = str(tmp_path / "streamed.safetensors")
    save_file(tensors, lora)

    def refuse(*args, **kwargs):
        raise AssertionError("merge loaded the model's weights")

    monkeypatch.setattr(ModelMixin, "from_pretrained", classmethod(refuse))
    out = tmp_path / "out"
    assert main(["merge", "--model", str(folder), "--lora", f"{lora}:0.5", "--component", COMPONENT,
                 "--out", str(out), "--dtype", "bf16"]) == 0
    assert sorted(f for f in os.listdir(out / COMPONENT) if f.endswith(".safetensors")) == shards
    assert not (out / "transformer").is_symlink() and (out / "model_index.json").is_file()
    index = json.loads((out / COMPONENT / "diffusion_pytorch_model.safetensors.index.json").read_text())
    fused = {k: v for shard in shards for k, v in load_file(str(out / COMPONENT / shard)).items()}
    assert set(index["weight_map"]) == set(fused)
    assert index["metadata"]["total_size"] == sum(t.numel() * 2 for t in fused.values())  # bf16 now
    base = module.state_dict()
    for name, spec in expected.items():
        exact = expected_value(base[name], spec, 0.5)
        assert bool(((fused[name].double() - exact).abs() <= exact.abs() * 2.0 ** -8 + 1e-30).all()), name


def test_inspect_lists_unmatched_keys_and_still_refuses(tiny_wan22_folder, merged, tmp_path, capsys):
    """``inspect --model`` shows the whole accounting (which keys match nothing), then exits 1 as the engine
    would refuse the file; a file that fits reports its counts and exits 0."""
    tensors = load_file(merged["lora"])
    unknown = {f"diffusion_model.extra_blocks.{i}.before_proj.lora_{s}.weight": torch.zeros(4, 4)
               for i in range(6) for s in ("down", "up")}
    path = tmp_path / "with_unknown.safetensors"
    save_file({**tensors, **unknown}, str(path))
    assert main(["inspect", str(path), "--model", tiny_wan22_folder, "--json"]) == 1
    captured = capsys.readouterr()
    report = json.loads(captured.out)
    assert {"format", "family", "rank", "alpha", "scale", "counts", "metadata", "contract", "accounting"} <= set(
        report)
    accounting = report["accounting"]
    assert sorted(accounting["unmatched"]) == sorted(unknown)
    assert accounting["counts"] == {"applied": len(tensors), "expected_unmatched": 0, "unmatched": len(unknown)}
    assert captured.err.startswith("lorabind inspect: refused: with_unknown.safetensors: 12 key(s) match nothing")
    assert main(["inspect", merged["lora"], "--model", tiny_wan22_folder, "--json"]) == 0
    clean = json.loads(capsys.readouterr().out)["accounting"]
    assert clean["refusal"] is None and clean["counts"]["unmatched"] == 0


def test_inspect_reports_mixed_alpha_and_scale_per_pair(merged, capsys):
    """The LightX2V-style file has alpha on block pairs and ``head.head`` but none on the other global layers:
    alpha is reported as both, never as if every pair declared it."""
    tensors = load_file(merged["lora"])
    alphas = {float(v) for k, v in tensors.items() if k.endswith(".alpha")}
    ranks = {v.shape[0] for k, v in tensors.items() if k.endswith(".lora_down.weight")}
    assert len(alphas) == len(ranks) == 1
    assert main(["inspect", merged["lora"], "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    (alpha,), (rank,) = alphas, ranks
    assert report["alpha"] == [alpha, None]
    assert report["scale"] == sorted([alpha / rank, 1.0])


def test_merge_of_a_dora_file_equals_its_fuse_bit_for_bit(tiny_wan22_folder, tmp_path):
    """DoRA's delta reads the base weight: the streaming merge (base = the stored tensor) and the in-memory fuse
    (base = the loaded parameter) must give the same bits."""
    from lorabind.loaders.binding.patching import PatchLayer, WeightPatcher

    module = load_transformer(tiny_wan22_folder, "transformer")
    g = torch.Generator().manual_seed(4)
    tensors = {}
    for flat, path in (("blocks_0_self_attn_q", "blocks.0.attn1.to_q"), ("blocks_1_ffn_2", "blocks.1.ffn.net.2")):
        out_f, in_f = module.get_submodule(path).weight.shape
        tensors.update({f"lora_unet_{flat}.lora_down.weight": torch.randn(4, in_f, generator=g) * 0.3,
                        f"lora_unet_{flat}.lora_up.weight": torch.randn(out_f, 4, generator=g) * 0.3,
                        f"lora_unet_{flat}.alpha": torch.tensor(2.0),
                        f"lora_unet_{flat}.dora_scale": torch.rand(1, in_f, generator=g) + 0.5})
    lora = str(tmp_path / "dora.safetensors")
    save_file(tensors, lora)
    out = str(tmp_path / "merged_dora")
    assert main(["merge", "--model", tiny_wan22_folder, "--lora", f"{lora}:0.6", "--component", "transformer",
                 "--out", out]) == 0
    applied = account(map_to_model(read_lora(lora), "wan2.2_moe", family_by_id("wan2.2_moe")), module).applied
    WeightPatcher({"transformer": module}).apply([PatchLayer("dora", "transformer", 0.6, applied)])
    merged_state, base = component_state(out, "transformer"), component_state(tiny_wan22_folder, "transformer")
    for path in ("blocks.0.attn1.to_q", "blocks.1.ffn.net.2"):
        fused = module.get_submodule(path).weight.detach()
        assert torch.equal(merged_state[f"{path}.weight"], fused), path
        assert not torch.equal(fused, base[f"{path}.weight"]), path
