"""Model files that change under a running process (issues 52, 54 and 61): a loaded model holds no page of a
user's file, so a truncated file cannot kill the process (SIGBUS) and a rewritten one cannot change a loaded
weight; the store notices any changed file and loads the model afresh, with one log line, without a ``KeyError``.

The truncation cases run in a child process: before the fix they die of SIGBUS, which must fail the test, not end
the test session."""

from __future__ import annotations

import gc
import json
import logging
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from bounded_child import run_case
from engine_probes import load_count
from hostile_files import rewrite_in_place
from lorabind.loaders.models.store import load_model

VAE_FILE = Path("vae") / "diffusion_pytorch_model.safetensors"
PACKAGE_PARENT = str(Path(__file__).resolve().parents[3])


def _copy(tiny_models_root, tmp_path, name="tiny-wan21-t2v") -> Path:
    folder = tmp_path / name
    shutil.copytree(tiny_models_root / "diffusers" / name, folder)
    return folder


def _mapped_files(folder: Path) -> list:
    """The files under ``folder`` that this process maps (Linux)."""
    prefix = str(folder.resolve())
    with open("/proc/self/maps", encoding="utf-8") as maps:
        return sorted({line.split(maxsplit=5)[5].strip() for line in maps
                       if len(line.split(maxsplit=5)) == 6 and line.split(maxsplit=5)[5].startswith(prefix)})


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/maps")
def test_a_loaded_model_maps_no_page_of_its_files(tiny_models_root, tmp_path):
    folder = _copy(tiny_models_root, tmp_path)
    model = load_model(folder, name="wan21")
    gc.collect()
    assert _mapped_files(folder) == []
    assert model.components["transformer"] is not None  # still loaded, its weights in memory of its own


def test_a_touched_index_loads_the_model_afresh_with_one_log_line_and_no_key_error(tiny_models_root, tmp_path,
                                                                                  caplog):
    """Issue 54: the store dropped its reference to the old model, the weak cache lost the entry with it, and the
    next pop raised ``KeyError(('<abs>/tiny-wan22-t2v', ...))`` into the prompt."""
    folder = _copy(tiny_models_root, tmp_path)
    load_model(folder, name="team/wan21")  # held by nothing but the store, as under `serve`
    os.utime(folder / "model_index.json")
    with caplog.at_level(logging.WARNING, logger="lorabind.models"):
        load_model(folder, name="team/wan21")
    assert load_count(folder) == 2
    lines = [r.getMessage() for r in caplog.records if r.name == "lorabind.models"]
    assert lines == ["lorabind: team/wan21 changed on disk since it was loaded; loading it afresh"]


def test_a_weight_rewritten_in_place_leaves_the_loaded_model_alone_and_loads_afresh(tiny_models_root, tmp_path):
    """Issue 61: a same-size rewrite of the (unpatched) VAE changed the next output silently. The loaded model
    keeps the weights it loaded; the next load notices the new file and loads it."""
    folder = _copy(tiny_models_root, tmp_path)
    first = load_model(folder, name="wan21")
    vae = first.pipeline.vae
    before = {name: p.detach().clone() for name, p in vae.named_parameters()}
    rewrite_in_place(folder / VAE_FILE)
    assert all(torch.equal(before[name], p) for name, p in vae.named_parameters())
    second = load_model(folder, name="wan21")
    assert second is not first and load_count(folder) == 2
    changed = [name for name, p in second.pipeline.vae.named_parameters() if not torch.equal(before[name], p)]
    assert changed  # the new file's weights


_TRUNCATE_UNDER_A_LOADED_MODEL = textwrap.dedent("""
    import os, sys, torch
    from lorabind.loaders.dispatch.generation_steps import decode, empty_latent
    from lorabind.loaders.lora.reader import read_lora
    from lorabind.loaders.models.store import load_model

    folder, lora_path = sys.argv[1], sys.argv[2]
    model = load_model(folder, name="wan21")
    lora = read_lora(lora_path)
    latent = empty_latent(model, 32, 32, 1)
    latent.samples.normal_(generator=torch.Generator().manual_seed(0))
    before = decode(model, latent)
    for path in (os.path.join(folder, "vae", "diffusion_pytorch_model.safetensors"),
                 os.path.join(folder, "transformer", "diffusion_pytorch_model.safetensors"), lora_path):
        os.truncate(path, 16)  # as `cp` over it does first
    after = decode(model, latent)
    factors = sum(float(t.float().abs().sum()) for p in lora.targets.values()
                  for deltas in p.parameter_deltas().values() for d in deltas for t in d.tensors())
    block = model.components["transformer"].blocks[0].attn1.to_q.weight
    print("same decode:", torch.equal(before, after), "factors:", factors > 0, "weights:", float(block.sum()) != 0)
""")


def test_files_truncated_under_a_loaded_model_and_a_read_lora_do_not_kill_the_process(tiny_models_root, tmp_path):
    """Issue 52: a truncated weight file killed the process with SIGBUS (exit 135) at the next touch of a weight
    still mapped from it. Here the VAE, the transformer and a read LoRA are truncated; the model decodes the same
    as before and every weight and LoRA factor is still readable."""
    folder = _copy(tiny_models_root, tmp_path)
    lora = tmp_path / "lora.safetensors"
    shutil.copy(tiny_models_root / "loras" / "lorabind-tiny" / "wan2.1_t2v_14b_lora_rank64_lightx2v_4step.safetensors",
                lora)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [PACKAGE_PARENT, os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, "-c", _TRUNCATE_UNDER_A_LOADED_MODEL, str(folder), str(lora)], env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"exit {done.returncode}: {done.stderr[-2000:]}"
    assert done.stdout.strip().splitlines()[-1] == "same decode: True factors: True weights: True"


def test_a_truncated_weight_file_is_refused_by_name_on_the_next_load(tiny_models_root, tmp_path):
    from lorabind.loaders.errors import ModelLoadError

    folder = _copy(tiny_models_root, tmp_path)
    load_model(folder, name="team/wan21")
    original = (folder / VAE_FILE).read_bytes()
    os.truncate(folder / VAE_FILE, len(original) // 2)
    with pytest.raises(ModelLoadError) as refused:
        load_model(folder, name="team/wan21")
    assert "team/wan21/vae/diffusion_pytorch_model.safetensors" in str(refused.value)
    assert str(tmp_path) not in str(refused.value)
    (folder / VAE_FILE).write_bytes(original)
    assert load_model(folder, name="team/wan21").pipeline.vae is not None  # the restored file loads again


def test_the_weight_index_of_a_sharded_component_is_read_as_a_bounded_regular_file(tmp_path):
    component = tmp_path / "transformer"
    component.mkdir()
    index = component / "diffusion_pytorch_model.safetensors.index.json"
    index.write_text(json.dumps({"weight_map": {"a.weight": "diffusion_pytorch_model-00001.safetensors"}}))
    lookup = f"""
        from lorabind.loaders.io.weight_sources import FolderWeightSources

        def case():
            found = FolderWeightSources({str(tmp_path)!r}).lookup("transformer", "a.weight")
            return found and found.file.rsplit("/", 2)[-2:]
    """
    assert run_case(lookup, timeout=60).outcome == "returned: ['transformer', 'diffusion_pytorch_model-00001.safetensors']"
    index.unlink()
    os.mkfifo(index)
    run = run_case(lookup, timeout=60)
    assert run.outcome == "returned: None" and run.seconds < 5  # every weight keeps a RAM backup; no hang
