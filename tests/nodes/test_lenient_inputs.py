"""The key-accounting error's advice exists where it is given: the fuse and adapter nodes take ``lenient``
(unmatched keys skipped and listed, every other check still on) and so does ``lorabind inspect``."""

from __future__ import annotations

import json
import os

import pytest
import torch
from safetensors.torch import load_file, save_file

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from lorabind.loaders.binding.bind import bind, unbind  # noqa: E402
from lorabind.loaders.errors import KeyMatchError  # noqa: E402
from lorabind.tiny_models import lora_fixtures as F  # noqa: E402

UNKNOWN = {f"diffusion_model.extra_blocks.{i}.before_proj.lora_{s}.weight": torch.zeros(4, 4)
           for i in range(3) for s in ("down", "up")}


@pytest.fixture(scope="module")
def models_root(tmp_path_factory):
    from lorabind.tiny_models import build_tiny

    root = tmp_path_factory.mktemp("lenient_models")
    build_tiny(root, names=("tiny-wan22-t2v",))
    F.write_fixture_loras(root)
    tensors = load_file(str(root / "loras" / F.WAN22_HIGH))
    save_file({**tensors, **UNKNOWN}, str(root / "loras" / "high_noise_with_unknown.safetensors"))
    return root


@pytest.fixture
def model(models_root, tmp_path):
    from lorabind.nodes import NODE_CLASS_MAPPINGS
    from lorabind.runtime import folder_paths

    folder_paths.configure(models_root=str(models_root), output_dir=str(tmp_path / "out"))
    try:
        (handle,) = NODE_CLASS_MAPPINGS["LoraBindModelLoader"]().load("tiny-wan22-t2v", "auto")
        yield handle
        unbind(handle.model)
    finally:
        folder_paths.configure()


def test_the_refusal_names_the_options_that_exist(model):
    from lorabind.nodes.adapter_nodes import FuseDistillLoRA

    with pytest.raises(KeyMatchError) as caught:
        FuseDistillLoRA().fuse(model, "high_noise_with_unknown.safetensors", 1.0, "transformer")
    message = str(caught.value)
    assert "6 key(s) match nothing in the transformer (wan2.2_moe)" in message
    # the input of the node that refused it, not another node's (issue 57)
    assert message.endswith("skip these keys explicitly: FuseDistillLoRA's 'lenient' input")
    assert "leniently" not in message


def test_a_file_none_of_whose_keys_applies_is_not_told_to_go_lenient(model, models_root, tiny_models_root):
    """Issue 54: a Qwen-Image LoRA on the Wan2.2 model matches none of its keys; 'lenient' would drop all of them
    and apply nothing, so the refusal does not offer it."""
    import shutil

    from lorabind.nodes.adapter_nodes import FuseDistillLoRA

    shutil.copy(tiny_models_root / "loras" / F.QWEN_LIGHTNING, models_root / "loras" / F.QWEN_LIGHTNING)
    with pytest.raises(KeyMatchError) as caught:
        FuseDistillLoRA().fuse(model, F.QWEN_LIGHTNING, 1.0, "transformer")
    message = str(caught.value)
    assert "key(s) match nothing in the transformer (wan2.2_moe)" in message and "qwen_image LoRA" in message
    assert message.endswith("Pick a LoRA made for this model")  # another family's file: nothing to skip to
    assert "lenient" not in message


def test_a_lenient_fuse_skips_only_the_unmatched_keys_and_binds(model):
    from lorabind.nodes.adapter_nodes import FuseDistillLoRA, WanMoELoRAPair

    out = FuseDistillLoRA().fuse(model, "high_noise_with_unknown.safetensors", 1.0, "transformer", lenient=True)
    (handle,) = out["result"]
    (accounting,) = out["ui"]["lorabind_accounting"]
    assert sorted(accounting["unmatched"]) == sorted(UNKNOWN)
    assert handle.fuses[0].lenient is True
    strict = FuseDistillLoRA().fuse(model, F.WAN22_HIGH, 1.0, "transformer")["ui"]["lorabind_accounting"][0]
    assert accounting["counts"]["applied"] == strict["counts"]["applied"] > 0
    report = bind(handle.model, handle.fuses, ())  # the sampler's bind honours the spec's lenient flag
    assert report.fuses[0]["accounting"]["counts"]["unmatched"] == len(UNKNOWN)
    paired = WanMoELoRAPair().pair(model, "high_noise_with_unknown.safetensors", 1.0, F.WAN22_LOW, 1.0, lenient=True)
    assert [f.lenient for f in paired["result"][0].fuses] == [True, True]
    with pytest.raises(KeyMatchError):
        WanMoELoRAPair().pair(model, "high_noise_with_unknown.safetensors", 1.0, F.WAN22_LOW, 1.0)


def test_inspect_lenient_lists_the_unmatched_keys_and_succeeds(models_root, capsys):
    from lorabind.runtime.cli import main

    path = str(models_root / "loras" / "high_noise_with_unknown.safetensors")
    model_dir = str(models_root / "diffusers" / "tiny-wan22-t2v")
    assert main(["inspect", path, "--model", model_dir, "--json"]) == 1
    capsys.readouterr()
    assert main(["inspect", path, "--model", model_dir, "--json", "--lenient"]) == 0
    captured = capsys.readouterr()
    assert sorted(json.loads(captured.out)["accounting"]["unmatched"]) == sorted(UNKNOWN)
    assert captured.err == ""
