"""A family registered from a test module loads, plans, binds, samples and decodes through the engine and the use
cases, with a denoiser that is not called ``transformer*``: what adding a family takes is its own package
(``toy_family.py``) plus one registry line (``families.register``)."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import save_file

import toy_family
from lorabind.loaders import families
from lorabind.loaders.models import store as model_store
from lorabind.loaders.binding.bind import unbind
from lorabind.loaders.handles import ModelHandle
from lorabind.loaders.placement import component_sizes
from lorabind.usecases import verbs
from lorabind.usecases.vocabulary import SampleOptions

RANK, STRENGTH = 2, 0.75


@pytest.fixture
def toy_root(tmp_path):
    families.register(toy_family.FAMILY)  # the one registry line a new family needs
    folder = toy_family.build_folder(tmp_path / "diffusers" / "tiny-toy")
    torch.manual_seed(1)
    down, up = torch.randn(RANK, 16), torch.randn(16, RANK)
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
