"""Non-regular and endless files where a model's files are read (issue 52): a FIFO, a link to ``/dev/zero`` and a
huge sparse file as a model's ``model_index.json``, and a FIFO as a component's config. ``models check`` and
``Generator`` answer each within 5 s and 300 MB, naming the file; before, the FIFO hung them and ``/dev/zero`` read
until memory ran out (7 GB)."""

from __future__ import annotations

import shutil

import pytest

from bounded_child import run_case
from hostile_files import write_special_file

KINDS = ["fifo", "dev-zero", "huge"]


@pytest.mark.parametrize("kind", KINDS)
def test_models_check_answers_at_once_on_a_special_index(tmp_path, kind):
    models = tmp_path / "models"
    write_special_file(models / "diffusers" / "bad" / "model_index.json", kind)
    run = run_case(f"""
        from lorabind.runtime import folder_paths
        from lorabind.usecases.model_check import check_prompt_files

        folder_paths.configure(models_root={str(models)!r}, output_dir={str(tmp_path / "out")!r},
                               input_dir={str(tmp_path / "in")!r}, temp_dir={str(tmp_path / "temp")!r})

        def case():
            prompt = {{"1": {{"class_type": "LoraBindModelLoader", "inputs": {{"model_name": "bad"}}}}}}
            (check,) = check_prompt_files(prompt, folder_paths)
            return check.line()
    """, timeout=90)
    assert run.outcome.startswith("returned: BROKEN   node 1 model_name: diffusers/bad"), run
    assert "model_index.json" in run.outcome
    assert run.seconds < 5 and run.peak_above_mib < 300, run


@pytest.mark.parametrize("kind", KINDS + ["fifo-config"])
def test_generator_refuses_a_special_file_by_name_at_once(tiny_models_root, tmp_path, kind):
    folder = tmp_path / "bad"
    if kind == "fifo-config":  # a real model whose VAE config is a FIFO: diffusers would wait on it
        shutil.copytree(tiny_models_root / "diffusers" / "tiny-wan21-t2v", folder)
        (folder / "vae" / "config.json").unlink()
        write_special_file(folder / "vae" / "config.json", "fifo")
    else:
        write_special_file(folder / "model_index.json", kind)
    run = run_case(f"""
        from lorabind import Generator

        def case():
            return Generator({str(folder)!r})
    """, timeout=120)
    assert run.outcome.startswith("raised ModelLoadError: bad"), run
    named = "vae/config.json" if kind == "fifo-config" else "model_index.json"
    assert named in run.outcome and str(tmp_path) not in run.outcome
    assert run.seconds < 5 and run.peak_above_mib < 300, run
