"""ComfyUI's core LoadImage / SaveImage / PreviewImage as the headless runtime provides them (never the pack)."""

import json

import numpy as np
import pytest
import torch
from PIL import Image

from lorabind.runtime import folder_paths
from lorabind.runtime.cli import main
from lorabind.runtime.core_nodes import CORE_NODE_CLASS_MAPPINGS, LoadImage, PreviewImage, SaveImage

CORE_NAMES = {"LoadImage", "SaveImage", "PreviewImage"}


@pytest.fixture
def folders(tmp_path):
    folder_paths.configure(models_root=str(tmp_path / "models"), output_dir=str(tmp_path / "out"),
                           input_dir=str(tmp_path / "in"), temp_dir=str(tmp_path / "temp"))
    (tmp_path / "in").mkdir()
    yield tmp_path
    folder_paths.configure()


def _rgba(path, size=(6, 4)):
    pixels = np.random.default_rng(0).integers(0, 256, (size[1], size[0], 4), dtype=np.uint8)
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(pixels, "RGBA").save(path)
    return pixels


def test_the_pack_never_registers_comfyui_core_names_the_runtime_adds_them():
    from lorabind import nodes
    from lorabind.runtime.core_nodes import runtime_node_classes

    assert not CORE_NAMES & set(nodes.NODE_CLASS_MAPPINGS)
    classes, names = runtime_node_classes()
    assert {name: classes[name] for name in CORE_NAMES} == CORE_NODE_CLASS_MAPPINGS
    assert set(nodes.NODE_CLASS_MAPPINGS) <= set(classes) and names["LoadImage"] == "Load Image"
    assert LoadImage.RELATIVE_PYTHON_MODULE == "nodes"  # /object_info reports them as ComfyUI's core nodes


def test_load_image_gives_comfyui_image_and_inverted_alpha_mask(folders):
    pixels = _rgba(folders / "in" / "sub" / "a.png")
    image, mask = LoadImage().load_image("sub/a.png")
    assert image.shape == (1, 4, 6, 3) and image.dtype == torch.float32
    assert torch.equal(image[0], torch.from_numpy(pixels[..., :3].astype(np.float32) / 255.0))
    assert torch.equal(mask[0], 1.0 - torch.from_numpy(pixels[..., 3].astype(np.float32) / 255.0))


def test_load_image_without_alpha_has_comfyuis_64x64_zero_mask_and_applies_exif_orientation(folders):
    picture = Image.new("RGB", (6, 2), (10, 20, 30))
    exif = Image.Exif()
    exif[0x0112] = 6  # "rotate 90° clockwise to display"
    picture.save(folders / "in" / "turned.png", exif=exif)
    image, mask = LoadImage().load_image("turned.png")
    assert image.shape == (1, 6, 2, 3)  # displayed upright: width and height swap
    assert torch.equal(mask, torch.zeros(1, 64, 64))
    assert image[0, 0, 0].tolist() == pytest.approx([10 / 255, 20 / 255, 30 / 255])


def test_load_image_reads_every_frame_of_an_animation(folders):
    frames = [Image.new("RGB", (4, 4), (v, v, v)) for v in (0, 128, 255)]
    frames[0].save(folders / "in" / "anim.png", save_all=True, append_images=frames[1:])
    image, mask = LoadImage().load_image("anim.png")
    assert image.shape == (3, 4, 4, 3) and mask.shape == (3, 64, 64)
    assert image[:, 0, 0, 0].tolist() == pytest.approx([0.0, 128 / 255, 1.0])


def test_validation_choices_and_change_detection(folders):
    _rgba(folders / "in" / "b.png")
    _rgba(folders / "in" / "sub" / "c.png")
    (folders / "in" / "notes.txt").write_text("x")
    choices, options = LoadImage.INPUT_TYPES()["required"]["image"]
    assert choices == ["b.png"] and options == {"image_upload": True}  # top level only, as ComfyUI lists
    assert LoadImage.VALIDATE_INPUTS("sub/c.png") is True
    for bad in ("missing.png", "../b.png", "/etc/hostname", "x.png [output]"):
        # a valid image outside the input folder is refused saying where to put it (never which local path)
        message = LoadImage.VALIDATE_INPUTS(bad)
        assert message.startswith(f"Invalid image file: {bad}: LoadImage reads only the input folder (`--input DIR`")
        assert "copy the image there, or upload it with POST /upload/image" in message
        assert str(folders) not in message
    _rgba(folders / "out" / "x.png")
    assert LoadImage.VALIDATE_INPUTS("x.png [output]") is True
    before = LoadImage.IS_CHANGED("b.png")
    assert before == LoadImage.IS_CHANGED("b.png")
    _rgba(folders / "in" / "b.png", size=(5, 5))
    assert LoadImage.IS_CHANGED("b.png") != before


def test_the_examples_images_are_among_the_choices_so_the_editor_does_not_mark_them_missing(folders):
    """Frontend 1.58.1 marks a LoadImage whose value is not among its choices "Media input missing" (red node):
    the examples' own ``lorabind-tiny/`` images are listed after the top-level ones; other subfolders are not."""
    from lorabind.runtime import folder_paths
    from lorabind.tiny_models.input_images import INPUT_FOLDER, write_input_images

    assert folder_paths.EXAMPLE_INPUT_FOLDER == INPUT_FOLDER
    write_input_images(folders / "in")
    _rgba(folders / "in" / "b.png")
    _rgba(folders / "in" / "sub" / "c.png")
    choices, _ = LoadImage.INPUT_TYPES()["required"]["image"]
    assert choices == ["b.png", "lorabind-tiny/control.png", "lorabind-tiny/end.png", "lorabind-tiny/start.png"]


def test_save_image_writes_one_png_per_image_with_the_prompt_and_preview_goes_to_temp(folders):
    images = torch.rand(2, 4, 6, 3)
    ui = SaveImage().save_images(images, "runs/x", prompt={"1": {}}, extra_pnginfo={"workflow": {"nodes": []}})
    assert ui == {"ui": {"images": [{"filename": f"x_0000{i}_.png", "subfolder": "runs", "type": "output"}
                                    for i in (1, 2)]}}
    saved = Image.open(folders / "out" / "runs" / "x_00002_.png")
    assert saved.size == (6, 4) and json.loads(saved.text["prompt"]) == {"1": {}}
    assert json.loads(saved.text["workflow"]) == {"nodes": []}
    assert np.array_equal(np.array(saved), np.clip(images[1].numpy() * 255 + 0.5, 0, 255).astype(np.uint8))
    preview = PreviewImage().save_images(images[:1])["ui"]["images"][0]
    assert preview["type"] == "temp" and preview["filename"].startswith("ComfyUI_temp_")
    assert (folders / "temp" / preview["filename"]).is_file()


def test_lorabind_run_executes_a_prompt_with_load_and_save_image(folders, capsys):
    pixels = _rgba(folders / "in" / "start.png")
    prompt = {"1": {"class_type": "LoadImage", "inputs": {"image": "start.png"}},
              "2": {"class_type": "SaveImage", "inputs": {"images": ["1", 0], "filename_prefix": "copy"}}}
    (folders / "p.json").write_text(json.dumps(prompt))
    code = main(["run", str(folders / "p.json"), "--models", str(folders / "models"), "--output",
                 str(folders / "out"), "--input", str(folders / "in")])
    assert code == 0, capsys.readouterr().err
    assert np.array_equal(np.array(Image.open(folders / "out" / "copy_00001_.png")), pixels[..., :3])
