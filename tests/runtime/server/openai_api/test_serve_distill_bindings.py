"""Issue 59 item 3 and item 4's single-file warning: the guide's distill command on a template that fuses the same
Lightning file already is refused at start, naming the node (it answered "bound 2 fused LoRA(s)" on the same 24
parameters); a base template of each family is shipped for that command; the engine refuses the same file fused
twice into one component on any path; and one ``--lora-path`` file on a Wan2.2 pair is said at start."""

from __future__ import annotations

from pathlib import Path

import pytest

import lorabind
from lorabind.loaders.errors import LoraBindError
from lorabind.tiny_models.lora_fixtures import QWEN_LIGHTNING, WAN21_DISTILL, WAN22_HIGH, WAN22_LOW

WORKFLOWS = Path(lorabind.__file__).parent / "workflows"
BASE = WORKFLOWS / "base"


def _serve(tiny_models_root, tmp_path, monkeypatch, template: Path, *lora_paths) -> int:
    """``lorabind serve --openai-model m=TEMPLATE --lora-backend distill --lora-path ...`` up to listening (the
    server is not run: every check at start has passed when it would be)."""
    from lorabind.runtime.cli import main
    from lorabind.runtime.server import app as server_app

    def listening(*args, **kwargs):  # run_server ends the process (os._exit) once run_app returns
        raise Listening()

    monkeypatch.setattr(server_app, "warm_up_in_background", lambda *args, **kwargs: None)
    monkeypatch.setattr(server_app.web, "run_app", listening)
    try:
        return main(["serve", "--models", str(tiny_models_root), "--port", "0", "--output", str(tmp_path / "out"),
                     "--input", str(tmp_path / "in"), "--temp", str(tmp_path / "temp"),
                     "--openai-model", f"m={template}", "--lora-backend", "distill", "--lora-path", *lora_paths])
    except Listening:
        return 0


class Listening(Exception):
    """The server got as far as listening."""


def test_the_guides_distill_command_on_the_lightning_template_is_refused_naming_the_node(
        tiny_models_root, tmp_path, monkeypatch, capsys):
    code = _serve(tiny_models_root, tmp_path, monkeypatch, WORKFLOWS / "api" / "qwen_image_lightning.api.json",
                  QWEN_LIGHTNING)
    out = capsys.readouterr().out
    assert code == 2
    assert (f"lorabind serve: --lora-path {QWEN_LIGHTNING}: the template of m (qwen_image_lightning.api.json) binds "
            "this file already (node 5, lora_name); fused again it would count twice. Serve a template without it "
            "(workflows/base/ holds one per model family) or leave --lora-path out") in out


def test_the_same_command_on_the_base_template_fuses_the_file_once(tiny_models_root, tmp_path, monkeypatch, capsys):
    code = _serve(tiny_models_root, tmp_path, monkeypatch, BASE / "qwen_image.api.json", QWEN_LIGHTNING)
    out = capsys.readouterr().out
    assert code == 0, out
    assert f"  distill: m fuses {QWEN_LIGHTNING} for the server's lifetime" in out and "  warning:" not in out


@pytest.mark.parametrize("name", ["wan22_t2v", "qwen_image", "minimax_h3"])
def test_each_familys_base_template_binds_no_lora_and_takes_distill_files(name):
    import json

    from lorabind.runtime.core_nodes import runtime_node_classes
    from lorabind.runtime.server.openai.templates import DISTILL_HOOK, load_template

    template = load_template("m", str(BASE / f"{name}.api.json"), runtime_node_classes()[0])
    assert DISTILL_HOOK in template.hooks and "prompt" in template.bindings
    classes = {node["class_type"] for node in json.loads((BASE / f"{name}.api.json").read_text()).values()}
    assert not classes & {"FuseDistillLoRA", "WanMoELoRAPair", "MiniMaxTurboSchedule", "LoadPEFTAdapter"}


def test_one_file_for_a_wan22_pair_is_said_at_start(tiny_models_root, tmp_path, monkeypatch, capsys):
    code = _serve(tiny_models_root, tmp_path, monkeypatch, BASE / "wan22_t2v.api.json", WAN22_HIGH)
    out = capsys.readouterr().out
    assert code == 0, out
    assert (f"  warning: --lora-path {WAN22_HIGH}: one file for the two experts of m; it is fused into transformer "
            "only, and the other expert runs undistilled. Give the high-noise and the low-noise file (high first) "
            "to distill both") in out


def test_the_pair_gets_no_warning(tiny_models_root, tmp_path, monkeypatch, capsys):
    assert _serve(tiny_models_root, tmp_path, monkeypatch, BASE / "wan22_t2v.api.json", WAN22_HIGH, WAN22_LOW) == 0
    assert "  warning:" not in capsys.readouterr().out


def test_the_engine_refuses_one_file_fused_twice_into_one_component(load_tiny, tiny_models_root):
    from lorabind.loaders.handles import ModelHandle
    from lorabind.usecases.adapters import attach_fuse

    path = str(tiny_models_root / "loras" / WAN21_DISTILL)
    once = attach_fuse(ModelHandle(load_tiny("tiny-wan21-t2v")), WAN21_DISTILL, path, 1.0, where="node 5").handle
    with pytest.raises(LoraBindError) as caught:
        attach_fuse(once, "again.safetensors", path, 0.5, where="node 6")
    assert str(caught.value) == (
        f"node 6: again.safetensors is fused into transformer of tiny-wan21-t2v already (as {WAN21_DISTILL} at "
        "strength 1); a second fuse of the same file would add to it (strength 1 + 0.5). Remove one of them, or give "
        "the one fuse the strength you want")


def test_the_same_file_into_the_other_expert_is_a_different_binding(load_tiny, tiny_models_root):
    from lorabind.loaders.handles import ModelHandle
    from lorabind.usecases.adapters import attach_fuse

    path = str(tiny_models_root / "loras" / WAN21_DISTILL)
    handle = ModelHandle(load_tiny("tiny-wan22-t2v"))
    high = attach_fuse(handle, WAN21_DISTILL, path, 1.0, "transformer", where="node 5").handle
    both = attach_fuse(high, WAN21_DISTILL, path, 1.0, "transformer_2", where="node 6").handle
    assert [fuse.component for fuse in both.fuses] == ["transformer", "transformer_2"]
