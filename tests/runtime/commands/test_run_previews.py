"""``lorabind run --preview DIR`` (issue 56): the main example's sampler writes one JPEG per step into DIR, the
last one the picture its denoised latent maps to; without the flag nothing is previewed; a file in the way is
refused by name before anything runs."""

import io
from pathlib import Path

import numpy as np
from PIL import Image

import lorabind
from lorabind.runtime.cli import main
from lorabind.runtime.preview_options import PREVIEW_EVENT
from lorabind.runtime.progress_display import PreviewFolder

MAIN_EXAMPLE = Path(lorabind.__file__).parent / "workflows" / "wan22_lightx2v_4step.json"


def test_run_writes_one_preview_per_step_of_the_main_example(tiny_models_root, tmp_path, capsys):
    code = main(["run", str(MAIN_EXAMPLE), "--models", str(tiny_models_root), "--output", str(tmp_path / "out"),
                 "--preview", str(tmp_path / "previews"), "--set", "6.seed=11"])
    assert code == 0, capsys.readouterr().err
    names = sorted(path.name for path in (tmp_path / "previews").iterdir())
    assert names == [f"node6_step{step}of4.jpg" for step in (1, 2, 3, 4)]
    frames = [np.asarray(Image.open(tmp_path / "previews" / name)) for name in names]
    assert all(frame.shape == (512, 512, 3) for frame in frames)  # a 4x4 latent fitted into 512 (ComfyUI's size)
    assert np.abs(frames[0].astype(int) - frames[-1].astype(int)).mean() > 5  # the picture moves as it denoises


def test_run_refuses_a_preview_folder_that_is_a_file(tmp_path, capsys):
    (tmp_path / "taken").write_text("mine")
    assert main(["run", str(MAIN_EXAMPLE), "--preview", str(tmp_path / "taken")]) == 2
    assert f"--preview {tmp_path / 'taken'}: not a folder" in capsys.readouterr().err
    assert (tmp_path / "taken").read_text() == "mine"


def test_the_preview_folder_writes_only_preview_events(tmp_path):
    folder = PreviewFolder(str(tmp_path / "p"))
    jpeg = io.BytesIO()
    Image.new("RGB", (2, 2)).save(jpeg, "JPEG")
    folder.on_event("progress", {"node": "3", "value": 1, "max": 2})
    folder.on_event(PREVIEW_EVENT, {"node": "3", "value": 2, "max": 2, "image": jpeg.getvalue()})
    assert [p.name for p in (tmp_path / "p").iterdir()] == ["node3_step2of2.jpg"]
    assert (tmp_path / "p" / "node3_step2of2.jpg").read_bytes() == jpeg.getvalue()
