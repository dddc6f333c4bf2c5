"""Qwen-Image-Edit and Edit-Plus: our sampler's latent equals QwenImageEditPipeline's / QwenImageEditPlusPipeline's
on the same images, prompts, seed and explicit sigmas (fp32, within 2e-5); the resizing rules are the pipelines';
prompts and models that do not fit are refused naming the input.

The reference pipelines get the processor ``edit_processor.load_processor`` builds: transformers 5 cannot construct
``Qwen2VLProcessor`` without torchvision (its video half), and the test venv has none. Its processing is
transformers' own ``Qwen2VLProcessor.__call__``; everything else (template, dropped prefix, resizing, VAE encoding,
packing, ``img_shapes``, the loop, true CFG) is the pipelines' code."""

import numpy as np
import pytest

from lorabind.loaders.contract_types import ResolvedSchedule
from lorabind.loaders.dispatch.generation_steps import (
    check_inputs,
    denoise,
    empty_latent,
    encode_text,
    encode_with_images,
)
from lorabind.loaders.families.qwen_image.edit import area_size
from lorabind.loaders.families.qwen_image.edit_processor import load_processor
from lorabind.loaders.families.qwen_image.prediction import pack_qwen_latents
from lorabind.loaders.generation.sampling import initial_noise
from wan_i2v_helpers import example_image

SIGMAS = (1.0, 0.8, 0.55, 0.3, 0.0)
SEED = 5
WIDTH, HEIGHT = 64, 48


def _pil(image):
    from PIL import Image

    return Image.fromarray((image[0].numpy() * 255 + 0.5).astype(np.uint8))


def _images(count):
    """The example start frame, then a 64x40 crop of the end frame (another aspect ratio)."""
    return [example_image("start"), example_image("end")[:, :40]][:count]


def _reference(model, pipeline_class, images, cfg):
    pipe = pipeline_class.from_pretrained(model.path, local_files_only=True, processor=load_processor(model.path))
    pipe.set_progress_bar_config(disable=True)
    pictures = [_pil(image) for image in images]
    shape = empty_latent(model, WIDTH, HEIGHT).samples.shape
    return pipe(image=pictures if len(pictures) > 1 else pictures[0], prompt="make the cat red",
                negative_prompt="blurry", true_cfg_scale=cfg, height=HEIGHT, width=WIDTH,
                sigmas=list(SIGMAS[:-1]), num_inference_steps=len(SIGMAS) - 1,
                latents=pack_qwen_latents(initial_noise(shape, SEED)), output_type="latent").images


def _ours(model, images, cfg):
    positive, notes = encode_with_images(model, "make the cat red", images)
    negative, _ = encode_with_images(model, "blurry", images)
    schedule = ResolvedSchedule(sigmas=SIGMAS, steps=len(SIGMAS) - 1, cfg=cfg, shift=1.0)
    return denoise(model, positive, negative, empty_latent(model, WIDTH, HEIGHT), schedule, SEED), notes


@pytest.mark.parametrize("name, pipeline, count, cfg", [
    ("tiny-qwen-image-edit", "QwenImageEditPipeline", 1, 4.0),
    ("tiny-qwen-image-edit-plus", "QwenImageEditPlusPipeline", 2, 4.0),  # Edit-2511 shape: zero_cond_t
    ("tiny-qwen-image-edit-plus", "QwenImageEditPlusPipeline", 1, 1.0),  # Lightning-style cfg 1, one image
])
@pytest.mark.slow
def test_latent_equals_the_diffusers_edit_pipeline(load_tiny, name, pipeline, count, cfg):
    import diffusers

    model = load_tiny(name)
    images = _images(count)
    ours, notes = _ours(model, images, cfg)
    reference = _reference(model, getattr(diffusers, pipeline), images, cfg)
    mine = pack_qwen_latents(ours.samples)
    assert mine.shape == reference.shape
    difference = float((mine - reference).abs().max())
    assert difference < 2e-5, f"{name}: max |ours - diffusers| = {difference}"
    assert float(reference.abs().max()) > 0.5
    assert len([line for line in notes if line.startswith("image_")]) == count


def test_resizing_rules_are_the_pipelines(load_tiny):
    """calculate_dimensions of both pipelines (diffusers 0.42), and the lines the node shows."""
    from diffusers.pipelines.qwenimage import pipeline_qwenimage_edit_plus as plus_module

    for width, height in ((64, 64), (64, 40), (1920, 1080), (500, 2000)):
        for area in (plus_module.CONDITION_IMAGE_SIZE, plus_module.VAE_IMAGE_SIZE):
            assert area_size(area, width, height) == plus_module.calculate_dimensions(area, width / height)
    model = load_tiny("tiny-qwen-image-edit-plus")
    _, notes = encode_with_images(model, "a cat", _images(2))
    assert notes[0].startswith("image_1 64x64: vision encoder 384x384, VAE 1024x1024")
    assert notes[1].startswith("image_2 64x40: vision encoder 480x288, VAE 1280x800")
    assert notes[2].startswith("output size the pipeline would pick for these images: 1280x800")


def test_edit_conditioning_carries_the_packed_image_tokens(load_tiny):
    model = load_tiny("tiny-qwen-image-edit-plus")
    conditioning, _ = encode_with_images(model, "a cat", _images(2))
    reference = conditioning.extra["qwen_image_edit"]
    assert reference.shapes == ((1, 64, 64), (1, 50, 80))
    assert reference.latents.shape == (1, 64 * 64 + 50 * 80, 16)


@pytest.mark.parametrize("name, count, message", [
    ("tiny-qwen-image-edit", 2, r"image_2: model 'tiny-qwen-image-edit' \(Qwen-Image-Edit\) takes at most 1"),
    ("tiny-qwen-image-edit-plus", 4, r"image_4: model 'tiny-qwen-image-edit-plus' .* takes at most 3"),
    ("tiny-qwen-image", 1, r"'tiny-qwen-image' is Qwen-Image text-to-image: it takes no input images"),
    ("tiny-wan21-t2v", 1, r"'tiny-wan21-t2v' \(wan2.1\) takes no input images"),
])
def test_models_that_cannot_take_the_images_are_refused_naming_the_input(load_tiny, name, count, message):
    images = (_images(2) * 2)[:count]
    with pytest.raises(ValueError, match=message):
        encode_with_images(load_tiny(name), "a cat", images)


def test_plain_prompts_and_other_variants_are_refused_on_the_sampler(load_tiny):
    edit, plus, t2i = (load_tiny(n) for n in ("tiny-qwen-image-edit", "tiny-qwen-image-edit-plus", "tiny-qwen-image"))
    with pytest.raises(ValueError, match="encode them with LoraBindTextEncodeImageEdit"):
        encode_text(edit, "a cat")
    schedule = ResolvedSchedule(sigmas=SIGMAS, steps=4, cfg=1.0, shift=1.0)
    edit_prompt, _ = encode_with_images(edit, "a cat", _images(1))
    with pytest.raises(ValueError, match=r"positive: it was encoded with input images for Qwen-Image-Edit,"):
        check_inputs(plus, edit_prompt, None, empty_latent(plus, 32, 32), schedule)
    with pytest.raises(ValueError, match="positive: it was encoded with input images .* is Qwen-Image text-to-image"):
        check_inputs(t2i, edit_prompt, None, empty_latent(t2i, 32, 32), schedule)
    plain = encode_text(t2i, "a cat")
    with pytest.raises(ValueError, match="positive: model 'tiny-qwen-image-edit' is Qwen-Image-Edit, which edits"):
        check_inputs(edit, plain, None, empty_latent(edit, 32, 32), schedule)
    guided = ResolvedSchedule(sigmas=SIGMAS, steps=4, cfg=4.0, shift=1.0)
    with pytest.raises(ValueError, match="negative: model 'tiny-qwen-image-edit' is Qwen-Image-Edit"):
        check_inputs(edit, edit_prompt, plain, empty_latent(edit, 32, 32), guided)
    check_inputs(edit, edit_prompt, None, empty_latent(edit, 32, 32), schedule)  # the fitting pair passes


def test_the_node_says_how_each_image_was_resized(load_tiny):
    from lorabind.loaders.handles import ModelHandle
    from lorabind.nodes.conditioning_nodes import LoraBindTextEncodeImageEdit

    model = ModelHandle(load_tiny("tiny-qwen-image-edit"))
    out = LoraBindTextEncodeImageEdit().encode(model, "make the ball red", example_image("end")[:, :40])
    (conditioning,) = out["result"]
    assert out["ui"]["text"][0].startswith("image_1 64x40: vision encoder 1280x800, VAE 1280x800 (Qwen-Image-Edit")
    assert conditioning.extra["qwen_image_edit"].shapes == ((1, 50, 80),)
    with pytest.raises(ValueError, match=r"image_2: model 'tiny-qwen-image-edit' \(Qwen-Image-Edit\) takes at most 1"):
        LoraBindTextEncodeImageEdit().encode(model, "a", example_image("start"), image_2=example_image("end"))
