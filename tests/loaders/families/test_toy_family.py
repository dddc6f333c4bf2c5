"""A family registered from a test module loads, plans, binds, samples and decodes through the engine and the use
cases, with a denoiser that is not called ``transformer*``, from its folder and from its own single files
(safetensors and GGUF, with its key layout and tokenizer): what adding a family takes is its own package
(``toy_family.py``, ``toy_configs/``) plus one registry line (``families.register``)."""

from __future__ import annotations

import pytest
import torch
import toy_family
from safetensors.torch import save_file

from lorabind.loaders import families
from lorabind.loaders.binding.bind import unbind
from lorabind.loaders.handles import ModelHandle
from lorabind.loaders.models import store as model_store
from lorabind.loaders.models.single_file.pipelines import detect_set, load_single_files
from lorabind.loaders.placement import component_sizes
from lorabind.usecases import verbs
from lorabind.usecases.vocabulary import SampleOptions

RANK, STRENGTH = 2, 0.75


@pytest.fixture
def toy_root(tmp_path):
    families.register(toy_family.FAMILY)  # the one registry line a new family needs
    folder = toy_family.build_folder(tmp_path / "diffusers" / "tiny-toy")
    torch.manual_seed(1)
    down, up = torch.randn(RANK, toy_family.HIDDEN), torch.randn(toy_family.HIDDEN, RANK)
    (tmp_path / "loras").mkdir()
    save_file({"mixers.0.lora_A.weight": down, "mixers.0.lora_B.weight": up,
               "mixers.0.alpha": torch.tensor(float(RANK))}, str(tmp_path / "loras" / "toy_style.safetensors"))
    yield folder, tmp_path / "loras" / "toy_style.safetensors", up @ down
    families.unregister(toy_family.FAMILY)
    model_store.clear_cache()


def test_the_toy_family_is_detected_and_planned_by_its_own_roles(toy_root):
    folder, _, _ = toy_root
    sizes = {size.name: size for size in component_sizes(folder, dtype="float32")}
    assert {name: size.role for name, size in sizes.items()} == {
        "backbone": "denoiser", "text_encoder": "text_encoder", "vae": "vae"}
    model = model_store.load_model(folder, device="cpu", memory="full")  # a plan from the sizes, not the CPU default
    assert (model.family, list(model.components)) == ("toy", ["backbone"])
    assert model.placement.plan.memory == "full" and set(model.placement.plan.resident) == set(sizes)
    for name, size in sizes.items():
        assert size.parameters == sum(p.numel() for p in model.pipeline.components[name].parameters()), name


def _run(handle, seed: int = 3):
    positive = verbs.encode_text(handle.model, "a toy")
    negative = verbs.encode_text(handle.model, "")
    latent = verbs.empty_latent(handle.model, 8, 6)
    samples, schedule, report = verbs.sample(handle, positive, negative, latent,
                                             SampleOptions(seed=seed, steps=3, cfg=2.0, shift=1.0))
    return samples, schedule, report


def test_the_toy_family_binds_samples_and_decodes(toy_root):
    folder, lora_path, delta = toy_root
    model = model_store.load_model(folder, device="cpu")
    base = ModelHandle(model)
    weight = model.components["backbone"].mixers[0].weight
    original = weight.detach().clone()

    plain, schedule, report = _run(base)
    assert report["experts"] == ["backbone"] * 3 and len(schedule.sigmas) == 4
    attached = verbs.attach_fuse(base, "toy_style.safetensors", str(lora_path), STRENGTH, where="toy test")
    assert attached.handle.fuses[0].component == "backbone"  # the family chose its main denoiser
    assert attached.accounting[0]["counts"] == {"applied": 3, "expected_unmatched": 0, "unmatched": 0}
    fused, _, _ = _run(attached.handle)
    torch.testing.assert_close(weight.detach(), original + STRENGTH * delta, rtol=0, atol=1e-5)
    assert not torch.allclose(fused.samples, plain.samples)

    image = verbs.decode(model, fused)
    assert image.shape == (1, 6, 8, 3) and 0.0 <= float(image.min()) and float(image.max()) <= 1.0
    assert float(image.std()) > 0

    unbind(model)
    assert torch.equal(weight.detach(), original)
    again, _, _ = _run(base)
    assert torch.equal(again.samples, plain.samples)  # the base model again, bit for bit


def _single_files(folder, files):
    """The toy folder as single files: the backbone in its own key layout (float32 safetensors, and a Q8_0 GGUF
    file from its bf16 weights), the VAE and the text encoder under their module names."""
    from lorabind.tiny_models.gguf_files import gguf_file_bytes, gguf_types

    files.mkdir()
    state = {name: cls.from_pretrained(folder, subfolder=name).state_dict()
             for name, cls in (("backbone", toy_family.ToyDenoiser), ("vae", toy_family.ToyVAE),
                               ("text_encoder", toy_family.ToyTextEncoder))}
    native = {toy_family.BACKBONE_LAYOUT.to_native(key): tensor for key, tensor in state["backbone"].items()}
    save_file(native, str(files / "toy_backbone.safetensors"))
    half = {key: tensor.bfloat16() for key, tensor in native.items()}
    (files / "toy_backbone_q8_0.gguf").write_bytes(
        gguf_file_bytes(half, gguf_types(half, "Q8_0", "blocks."), architecture="toy", quant="Q8_0"))
    save_file(state["vae"], str(files / "toy_vae.safetensors"))
    save_file(state["text_encoder"], str(files / "toy_text.safetensors"))
    return files


def _load_set(files, denoiser: str):
    checked = detect_set([(str(files / denoiser), denoiser)], (str(files / "toy_vae.safetensors"), "toy_vae"),
                         (str(files / "toy_text.safetensors"), "toy_text"))
    assert (checked.family, checked.denoisers[0].title) == ("toy", "Toy backbone")
    return load_single_files(checked, dtype=torch.float32, device="cpu")


def test_the_toy_family_loads_its_own_single_files_and_gguf(toy_root):
    folder, lora_path, _ = toy_root
    files = _single_files(folder, folder.parent.parent / "single")
    from_folder = model_store.load_model(folder, device="cpu")
    plain = _load_set(files, "toy_backbone.safetensors")
    assert (plain.family, list(plain.components)) == ("toy", ["backbone"])
    assert plain.pipeline.tokenizer.vocab == toy_family.VOCAB  # built by the text encoder kind's tokenizer
    for name, weight in from_folder.components["backbone"].state_dict().items():
        assert torch.equal(plain.components["backbone"].state_dict()[name], weight), name
    folder_run, _, _ = _run(ModelHandle(from_folder))
    file_run, _, _ = _run(ModelHandle(plain))
    assert torch.equal(file_run.samples, folder_run.samples)  # same weights, same run

    quantized = _load_set(files, "toy_backbone_q8_0.gguf")
    mixer = quantized.components["backbone"].mixers[0].weight
    assert type(mixer).__name__ == "GGUFParameter"  # kept quantized, dequantised at each forward
    gguf_run, _, _ = _run(ModelHandle(quantized))
    torch.testing.assert_close(gguf_run.samples, folder_run.samples, rtol=0, atol=0.05)
    attached = verbs.attach_fuse(ModelHandle(quantized), "toy_style.safetensors", str(lora_path), STRENGTH,
                                 where="toy test")
    assert attached.accounting[0]["counts"] == {"applied": 3, "expected_unmatched": 0, "unmatched": 0}
    fused, _, _ = _run(attached.handle)
    assert not torch.allclose(fused.samples, gguf_run.samples)
