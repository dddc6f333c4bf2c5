"""``lorabind run``'s command-line changes reach what the outputs carry (issue 30): ``--set`` on a UI workflow
changes the workflow embedded in the outputs too (reopening an output brings back what ran), and
``--input-file NODE=PATH`` reads an image outside the input folder by explicit path; the image-to-video node
says when it resizes an image."""

from __future__ import annotations

import json

import pytest
import torch

from lorabind.runtime import folder_paths
from lorabind.runtime.cli import main
from lorabind.runtime.commands import run as run_command
from lorabind.runtime.core_nodes import LoadImage
from runtime_fake_nodes import FAKE_NODES
from ui_workflow_builders import _seeded_subgraph, out, sock, ui_node


class ShowImageSize:
    """Shows the size of the IMAGE it gets, so a test sees which file was read."""

    OUTPUT_NODE = True
    RETURN_TYPES = ()
    FUNCTION = "show"

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"image": ("IMAGE",)}}

    def show(self, image):
        return {"ui": {"text": [f"{image.shape[2]}x{image.shape[1]}"]}}


NODES = {**FAKE_NODES, "LoadImage": LoadImage, "ShowImageSize": ShowImageSize}


@pytest.fixture
def fake_pack(monkeypatch):
    monkeypatch.setattr(run_command, "load_node_classes", lambda: (NODES, {}))
    monkeypatch.setattr(run_command, "ensure_models", lambda prompt, root, input_dir: None)
    yield
    folder_paths.configure()


def run(tmp_path, workflow: dict, *extra) -> int:
    path = tmp_path / "workflow.json"
    path.write_text(json.dumps(workflow))
    return main(["run", str(path), "--models", str(tmp_path / "models"), "--output", str(tmp_path / "out"),
                 "--input", str(tmp_path / "input"), *extra])


def seeded_ui_workflow() -> dict:
    """RtInt -> RtSeeded (seed widget with its hidden control value) -> RtHidden (reports the embedded workflow)."""
    return {"nodes": [
        ui_node(1, "RtInt", outputs=[out("INT", [1])], widgets=[3]),
        ui_node(2, "RtSeeded", inputs=[sock("base", "INT", 1)], outputs=[out("INT", [2])],
                widgets=[5, "fixed", "add", "fixed", "", "plain", 1.0, 0]),
        ui_node(3, "RtHidden", inputs=[sock("value", "INT", 2)]),
    ], "links": [[1, 1, 0, 2, 0, "INT"], [2, 2, 0, 3, 0, "INT"]]}


def test_set_changes_the_ui_workflow_embedded_in_the_outputs(fake_pack, tmp_path, monkeypatch):
    seen = {}
    original = FAKE_NODES["RtHidden"].run
    monkeypatch.setattr(FAKE_NODES["RtHidden"], "run",
                        lambda self, value, unique_id, prompt, extra_pnginfo: seen.update(
                            value=value, workflow=extra_pnginfo["workflow"]) or original(
                            self, value, unique_id, prompt, extra_pnginfo))
    workflow = seeded_ui_workflow()
    assert run(tmp_path, workflow, "--set", "2.seed=7", "--set", "2.scale=2.5", "--set", "1.value=4") == 0
    assert seen["value"] == int((4 + 7) * 2.5)
    nodes = {node["id"]: node for node in seen["workflow"]["nodes"]}
    # the hidden control values (after the seed, two after the combo) stay; scale is the 7th slot
    assert nodes[2]["widgets_values"] == [7, "fixed", "add", "fixed", "", "plain", 2.5, 0]
    assert nodes[1]["widgets_values"] == [4]
    assert workflow["nodes"][1]["widgets_values"][0] == 5  # the file's own workflow is not touched


def test_set_on_a_linked_input_or_a_subgraph_node_says_the_embedded_workflow_keeps_it(fake_pack, tmp_path,
                                                                                          capsys):
    from lorabind.runtime.workflow_overrides import embed_overrides

    workflow = seeded_ui_workflow()
    workflow["definitions"] = {"subgraphs": [_seeded_subgraph()]}
    embedded, notes = embed_overrides(workflow, {"2": {"base": 9}, "7:1": {"seed": 1}}, NODES, {})
    assert embedded == workflow
    assert notes == [
        "node 2 input 'base': the workflow embedded in the outputs keeps its old value (the input is linked: the "
        "editor takes its value from the link)",
        "node 7:1 input 'seed': the workflow embedded in the outputs keeps its old value (the node is inside a "
        "subgraph, whose definition every instance shares)"]


def write_png(path, width, height):
    from PIL import Image

    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (width, height), (200, 30, 40)).save(path)


def test_input_file_reads_an_image_outside_the_input_folder_by_its_path(fake_pack, tmp_path, capsys):
    photo = tmp_path / "elsewhere" / "my photo.png"
    write_png(photo, 12, 8)
    prompt = {"1": {"class_type": "LoadImage", "inputs": {"image": "missing.png"}},
              "2": {"class_type": "ShowImageSize", "inputs": {"image": ["1", 0]}}}
    assert run(tmp_path, prompt, "--input-file", f"1={photo}") == 0
    captured = capsys.readouterr()
    assert f"node 1 (LoadImage) reads {photo} (as 'my photo.png')" in captured.out
    assert "node 2 (ShowImageSize) text: 12x8" in captured.out
    assert not (tmp_path / "input").exists()  # nothing copied into the input folder
    folder_paths.configure()
    assert folder_paths.explicit_input_files == {}  # the next run starts from its own command line


@pytest.mark.parametrize("argument, message", [
    ("1", "expected NODE=PATH"),
    ("9=x.png", "the workflow has no node with id '9'"),
    ("2=x.png", "node 2 (RtShow) has no image file input (use it on a LoadImage node)"),
    ("1=no/such.png", "'no/such.png' is not a file"),
])
def test_input_file_refusals_name_the_argument(fake_pack, tmp_path, capsys, argument, message):
    prompt = {"1": {"class_type": "LoadImage", "inputs": {"image": "x.png"}},
              "2": {"class_type": "RtShow", "inputs": {"value": 1}}}
    assert run(tmp_path, prompt, "--input-file", argument) == 1
    err = capsys.readouterr().err
    assert f"lorabind run: --input-file '{argument}': {message}" in err


def test_a_path_given_as_an_image_name_is_still_refused_saying_where_images_go(fake_pack, tmp_path, capsys):
    photo = tmp_path / "elsewhere" / "start.png"
    write_png(photo, 8, 8)
    prompt = {"1": {"class_type": "LoadImage", "inputs": {"image": str(photo)}},
              "2": {"class_type": "ShowImageSize", "inputs": {"image": ["1", 0]}}}
    assert run(tmp_path, prompt) == 1
    assert "LoadImage reads only the input folder" in capsys.readouterr().err


@pytest.mark.parametrize("size, expected", [
    ((32, 32), None),
    ((64, 48), "start_image 64x48 resized to 32x32 (aspect ratio not kept)"),
    ((64, 64), "start_image 64x64 resized to 32x32 (aspect ratio kept)"),
])
def test_the_image_to_video_node_says_when_it_resizes(monkeypatch, size, expected):
    from lorabind.nodes import latent_nodes

    monkeypatch.setattr(latent_nodes, "image_to_video_latent", lambda *args, **kwargs: "latent")
    model = type("Handle", (), {"model": None})()
    image = torch.zeros(1, size[1], size[0], 3)
    returned = latent_nodes.LoraBindImageToVideo().encode(model, image, 32, 32, 5, 1)
    if expected is None:
        assert returned == ("latent",)
    else:
        assert returned == {"ui": {"text": [expected]}, "result": ("latent",)}
