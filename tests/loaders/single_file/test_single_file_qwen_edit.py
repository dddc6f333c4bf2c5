"""Qwen-Image-Edit from ComfyUI's single files. The edit transformers have Qwen-Image's shapes, so the edition
comes from the 2511 marker key (``__index_timestep_zero__``, as Comfy-Org's Edit-2511 files carry it) or the file
name; a tiny Edit-2511 set loads as ``QwenImageEditPlusPipeline`` with ``zero_cond_t`` and renders what the
folder renders; a tokenizer without vision tokens is refused naming the file."""

import json

import pytest
import torch

from lorabind.loaders.contract_types import ResolvedSchedule
from lorabind.loaders.dispatch.generation_steps import denoise, empty_latent, encode_with_images
from lorabind.loaders.errors import ModelLoadError
from lorabind.loaders.families.qwen_image import key_layouts as qwen_layouts
from lorabind.loaders.families.wan import key_layouts as layouts
from lorabind.loaders.models.single_file.detect import check_set, detect
from lorabind.loaders.models.single_file.native_files import native_tensors
from lorabind.loaders.models.single_file.pipelines import load_single_files
from wan_i2v_helpers import example_image

EDIT_PLUS = "tiny-qwen-image-edit-plus"
MARKER = "__index_timestep_zero__"


def _component(folder, name):
    from safetensors.torch import load_file

    state = {}
    for file in sorted((folder / name).glob("*.safetensors")):
        state.update(load_file(str(file)))
    return state


@pytest.fixture(scope="module")
def edit_files(tiny_models_root, tmp_path_factory):
    """The tiny Edit-Plus folder as ComfyUI-style single files: the transformer under several published names (one
    with the 2511 marker), the 8x VAE and the Qwen2.5-VL with its vision tower."""
    from safetensors.torch import save_file

    folder = tiny_models_root / "diffusers" / EDIT_PLUS
    out = tmp_path_factory.mktemp("edit_single_files")
    transformer = native_tensors(_component(folder, "transformer"), qwen_layouts.QWEN_IMAGE_TRANSFORMER)
    for name, marked in (("qwen_image_edit_2511_bf16", True), ("renamed_download", True),
                         ("qwen_image_edit_2509_bf16", False), ("qwen_image_edit_bf16", False),
                         ("qwen_image_bf16", False)):
        tensors = {**transformer, **({MARKER: torch.empty(0)} if marked else {})}
        save_file({k: v.contiguous() for k, v in tensors.items()}, str(out / f"{name}.safetensors"))
    config = json.loads((folder / "vae" / "config.json").read_text())
    save_file(native_tensors(_component(folder, "vae"), layouts.vae_layout_for(config)),
              str(out / "qwen_image_vae_edit_tiny.safetensors"))
    save_file(native_tensors(_component(folder, "text_encoder"), qwen_layouts.QWEN25_VL_ENCODER),
              str(out / "qwen_2.5_vl_edit_tiny_bf16.safetensors"))
    return out, folder


@pytest.mark.parametrize("name, edition, zero_cond_t", [
    ("qwen_image_edit_2511_bf16", "Qwen-Image-Edit-2511", True),
    ("renamed_download", "Qwen-Image-Edit-2511", True),  # the marker decides whatever the name
    ("qwen_image_edit_2509_bf16", "Qwen-Image-Edit-2509", False),
    ("qwen_image_edit_bf16", "Qwen-Image-Edit", False),
    ("qwen_image_bf16", None, False),  # same shapes, no marker, no "edit": text-to-image
])
def test_the_edition_comes_from_the_marker_or_the_name(edit_files, name, edition, zero_cond_t):
    found = detect(str(edit_files[0] / f"{name}.safetensors"))
    assert found.model.config == "qwen_image_transformer_tiny"  # the shapes alone: Qwen-Image's
    assert found.edition == edition and bool(found.config.get("zero_cond_t")) == zero_cond_t
    assert found.title.startswith(edition or "Qwen-Image")


def test_a_2511_file_asks_for_the_diffusers_release_with_zero_cond_t(edit_files):
    from lorabind.loaders.families import family_by_id, requirements_for

    family = family_by_id("qwen_image")
    for name, wanted in (("renamed_download", "qwen_image_edit_2511"), ("qwen_image_edit_2509_bf16", "qwen_image")):
        found = detect(str(edit_files[0] / f"{name}.safetensors"))
        assert family.layout.requirements_id("qwen_image", variant=found.edition or found.model.variant) == wanted
    assert requirements_for("qwen_image_edit_2511") == ({"diffusers": "0.37", "transformers": "4.49"},
                                                       "Qwen-Image-Edit-2511")


@pytest.mark.slow
def test_a_2511_set_loads_as_edit_plus_and_renders_what_the_folder_renders(edit_files):
    """In bf16 (what the files hold) the two loads compute the same thing."""
    from lorabind.loaders.models.store import load_model

    out, folder = edit_files
    files = check_set([detect(str(out / "renamed_download.safetensors"))],
                      detect(str(out / "qwen_image_vae_edit_tiny.safetensors")),
                      detect(str(out / "qwen_2.5_vl_edit_tiny_bf16.safetensors")))
    model = load_single_files(files, tokenizer_dirs=[folder / "processor"], dtype=torch.bfloat16)
    assert type(model.pipeline).__name__ == "QwenImageEditPlusPipeline"
    assert model.components["transformer"].config.zero_cond_t is True
    reference = load_model(str(folder), name=EDIT_PLUS, dtype=torch.bfloat16)
    schedule = ResolvedSchedule(sigmas=(1.0, 0.6, 0.0), steps=2, cfg=1.0, shift=1.0)
    results = []
    for loaded in (model, reference):
        positive, _ = encode_with_images(loaded, "make the ball red", [example_image("start")])
        results.append(denoise(loaded, positive, None, empty_latent(loaded, 32, 32), schedule, 7).samples)
    assert torch.equal(results[0], results[1])


def test_an_edit_set_needs_a_tokenizer_with_vision_tokens(edit_files, tiny_models_root):
    out, _ = edit_files
    files = check_set([detect(str(out / "qwen_image_edit_2511_bf16.safetensors"))],
                      detect(str(out / "qwen_image_vae_edit_tiny.safetensors")),
                      detect(str(out / "qwen_2.5_vl_edit_tiny_bf16.safetensors")))
    text_to_image_tokenizer = tiny_models_root / "diffusers" / "tiny-qwen-image" / "tokenizer"
    with pytest.raises(ModelLoadError, match=r"qwen_image_edit_2511_bf16.safetensors: an image-editing model needs "
                                             r"Qwen2.5-VL's tokenizer with its vision tokens"):
        load_single_files(files, tokenizer_dirs=[text_to_image_tokenizer], dtype=torch.float32)
