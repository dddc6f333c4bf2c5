"""Issue 44 items 1 and 2: an extracted LoRA is keyed so the model takes it (LightX2V's ``key_prefix: auto``, a
named prefix with its separator) and declares exactly the contract of the file that was baked in: bake (merge into
a single file) -> extract -> bind gives the source's contract field by field, a field the source leaves open stays
open, and the guide's I2V recipe (flow shift 12, boundary 0.875) runs with the extracted pair."""

from __future__ import annotations

import json

import pytest
from safetensors import safe_open

from lorabind.loaders.contracts.sigmas import shifted_sigmas
from lorabind.loaders.dispatch.contract_discovery import SamplingRequest, discover_contract, resolve_schedule
from lorabind.loaders.handles import ModelHandle
from lorabind.runtime.cli import main
from lorabind.tiny_models import lora_fixtures as F
from lorabind.usecases.adapters import attach_fuse, expert_slots

TINY = "lorabind-tiny/{}_bf16.safetensors"
# (single file stem, diffusers tiny model, fixture LoRA, extracted file name, expert index or None)
CASES = {
    "t2v-high": ("wan2.2_t2v_high_noise_tiny", "tiny-wan22-t2v", F.WAN22_HIGH, "my_high_noise_extract", 0),
    "t2v-low": ("wan2.2_t2v_low_noise_tiny", "tiny-wan22-t2v", F.WAN22_LOW, "my_low_noise_extract", 1),
    "i2v-high": ("wan2.2_i2v_high_noise_tiny", "tiny-wan22-i2v", F.WAN22_I2V_HIGH, "my_i2v_high_noise_extract", 0),
    "i2v-low": ("wan2.2_i2v_low_noise_tiny", "tiny-wan22-i2v", F.WAN22_I2V_LOW, "my_i2v_low_noise_extract", 1),
    "qwen": ("qwen_image_tiny", "tiny-qwen-image", F.QWEN_LIGHTNING, "my_qwen_extract", None),
}
FIELDS = ("kind", "family", "steps", "sigmas", "shift", "cfg", "tasks", "scheduler")


def _bake_and_extract(root, tmp_path, case: str, *extract_options) -> tuple:
    stem, _, lora, out_name, _ = CASES[case]
    base = root / "diffusion_models" / TINY.format(stem)
    merged = tmp_path / f"{stem}_merged.safetensors"
    assert main(["merge", "--model", str(base), "--lora", str(root / "loras" / lora), "--out", str(merged),
                 "--dtype", "fp32", "--overwrite"]) == 0
    out = tmp_path / f"{out_name}.safetensors"
    assert main(["extract", "--base", str(base), "--tuned", str(merged), "--out", str(out), "--rank", "8",
                 "--overwrite", *extract_options]) == 0
    return root / "loras" / lora, out


def _fields(contract) -> dict:
    return {name: getattr(contract, name) for name in FIELDS}


def _bound(load_tiny, case: str, name: str, path) -> ModelHandle:
    """The extracted file fused into the tiny model's expert (or denoiser): the contract the sampler enforces."""
    model_name, expert = CASES[case][1], CASES[case][4]
    handle = ModelHandle(load_tiny(model_name))
    component = expert_slots(handle)[expert] if expert is not None else None
    attached = attach_fuse(handle, name, str(path), 1.0, component, where="test")
    assert attached.accounting[0]["counts"].get("unmatched", 0) == 0
    return attached.handle


@pytest.mark.parametrize("case", sorted(CASES))
def test_bake_extract_bind_gives_the_sources_contract_field_by_field(single_file_root, tmp_path, load_tiny, case):
    source, extracted = _bake_and_extract(single_file_root, tmp_path, case)
    want = _fields(discover_contract(str(source)))
    got = discover_contract(str(extracted))
    assert got.declared_by == "metadata" and _fields(got) == want
    bound = _bound(load_tiny, case, extracted.name, extracted).contracts[-1]
    assert _fields(bound) == want


def test_a_field_the_metadata_leaves_out_stays_open(single_file_root, tmp_path):
    _, extracted = _bake_and_extract(single_file_root, tmp_path, "i2v-high")
    with safe_open(str(extracted), "pt") as handle:
        assert handle.metadata()["sampling_contract"] == "steps=4, cfg=1, tasks=i2v"  # no shift: the source has none
    contract = discover_contract(str(extracted))
    assert (contract.steps, contract.shift, contract.sigmas, contract.cfg) == (4, None, None, 1.0)


def test_the_guides_i2v_recipe_runs_with_the_extracted_pair(single_file_root, tmp_path, load_tiny):
    _, high = _bake_and_extract(single_file_root, tmp_path, "i2v-high")
    _, low = _bake_and_extract(single_file_root, tmp_path, "i2v-low")
    handle = ModelHandle(load_tiny("tiny-wan22-i2v"))
    for path, component in zip((high, low), expert_slots(handle)):
        handle = attach_fuse(handle, path.name, str(path), 1.0, component, where="test").handle
    # vllm-omni's guide: --num-inference-steps 4 --flow-shift 12 --guidance-scale 1.0 --boundary-ratio 0.875
    recipe = SamplingRequest(steps=4, cfg=1.0, shift=12.0, boundary=0.875, task="i2v")
    resolved = resolve_schedule(handle, None, None, recipe)
    assert resolved.overrides == () and resolved.sigmas == shifted_sigmas(4, 12.0)
    # and it runs, through the Python API, on the tiny I2V model
    from lorabind import Generator
    from wan_i2v_helpers import example_image

    video = Generator(_handle=ModelHandle(load_tiny("tiny-wan22-i2v"))).bind_distill(high, low).generate(
        "a cat", image=example_image(), steps=4, flow_shift=12.0, guidance_scale=1.0, boundary_ratio=0.875,
        height=32, width=32, num_frames=5, seed=1)
    assert video.schedule["overrides"] == [] and len(video.frames) == 5
    assert [c["source"] for c in video.schedule["contracts"]] == [high.name, low.name]


@pytest.mark.parametrize("option, prefix", [
    (["--config", "auto.json"], ""),  # LightX2V's key_prefix: auto -> the tiny file's own keys carry none
    (["--key-prefix", "diffusion_model"], "diffusion_model."),
    (["--key-prefix", "model.diffusion_model."], "model.diffusion_model."),
])
def test_key_prefix_auto_or_named_writes_keys_the_model_takes(single_file_root, tmp_path, load_tiny, option, prefix,
                                                              capsys):
    (tmp_path / "auto.json").write_text(json.dumps({"key_prefix": "auto"}))
    option = [str(tmp_path / value) if value.endswith(".json") else value for value in option]
    _, extracted = _bake_and_extract(single_file_root, tmp_path, "t2v-high", *option)
    with safe_open(str(extracted), "pt") as handle:
        keys = list(handle.keys())
    assert all(key.startswith(prefix + "blocks.") or key.startswith(prefix) and "." in key[len(prefix):]
               for key in keys)
    assert not any(key.startswith(("auto", "diffusion_modelblocks")) for key in keys)
    _bound(load_tiny, "t2v-high", extracted.name, extracted)  # zero unmatched keys
    capsys.readouterr()
    assert main(["inspect", str(extracted)]) == 0
    assert "contract: my_high_noise_extract.safetensors: distill steps=4 shift=5 cfg=1 (declared by its metadata)" \
        in capsys.readouterr().out


def test_key_prefix_auto_takes_a_single_files_own_prefix(tmp_path):
    from lorabind.loaders.offline.extraction import output_prefix

    class Prefixed:
        key_prefix = "model.diffusion_model."

    assert output_prefix("auto", Prefixed()) == "model.diffusion_model."
    assert (output_prefix("transformer", None), output_prefix("", None)) == ("transformer.", "")


def test_inspect_says_a_metadata_contract_it_cannot_read_instead_of_none_declared(tmp_path, capsys):
    import torch
    from safetensors.torch import save_file

    path = tmp_path / "odd.safetensors"
    save_file({"autoblocks.0.to_k.lora_A.weight": torch.zeros(2, 4), "autoblocks.0.to_k.lora_B.weight":
               torch.zeros(4, 2)}, str(path), metadata={"sampling_contract": "steps=4, cfg=1"})
    assert main(["inspect", str(path)]) == 0
    out = capsys.readouterr().out
    assert "none declared" not in out
    assert "contract: not read: its metadata declares sampling_contract='steps=4, cfg=1'" in out
