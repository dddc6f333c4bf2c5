"""The family interface on the real tiny models: the registry finds each model's family, the families name their
denoisers' roles and components, and every denoiser forward of a sampling run goes through
``family.sampling.forward`` (the one place a device/offload hook wraps). ``ModelFamily`` itself stays small: its
own members are counted."""

from __future__ import annotations

import pytest

from lorabind.loaders import families
from lorabind.loaders.contract_types import ResolvedSchedule
from lorabind.loaders.contracts.sigmas import shifted_sigmas
from lorabind.loaders.dispatch import generation_steps as generation
from lorabind.loaders.errors import ModelLoadError
from lorabind.loaders.families.interface import ModelFamily, PipelineSource
from lorabind.loaders.families.parts import FamilyContracts, FamilyLayout, FamilySampling

SCHEDULE = ResolvedSchedule(sigmas=shifted_sigmas(2, 5.0), steps=2, cfg=1.0, shift=5.0)


def test_registry_finds_each_family_by_model_index_id_and_model():
    wan, qwen, minimax = families.all_families()
    assert (wan.id, qwen.id, minimax.id) == ("wan", "qwen_image", "minimax_h3")
    assert families.detect_model_family({"_class_name": "WanPipeline", "transformer_2": ["d", "X"]}) == "wan2.2_moe"
    assert families.detect_model_family({"_class_name": "WanPipeline", "transformer_2": [None, None]}) == "wan2.1"
    assert families.detect_model_family({"_class_name": "QwenImagePipeline"}) == "qwen_image"
    assert families.detect_model_family({"_class_name": "X", "_minimax_h3": {}}) == "minimax_h3"
    with pytest.raises(ModelLoadError, match="unsupported pipeline class 'FluxPipeline'"):
        families.detect_model_family({"_class_name": "FluxPipeline"})
    assert families.family_for_index({"_class_name": "QwenImagePipeline"}) is qwen
    assert families.family_by_id("wan2.1") is wan and families.family_by_id("wan") is wan
    assert families.family_serving("flux") is None
    with pytest.raises(KeyError, match="no LoRA key map for model family 'flux'"):
        families.family_by_id("flux")


REQUIRED = {FamilyLayout: ("detect",), FamilyContracts: ("resolve_schedule",),
            FamilySampling: ("load_pipeline", "encode_text", "empty_latent", "check_inputs", "denoise", "decode")}


def test_every_family_implements_the_whole_interface():
    for family in families.all_families():
        missing = [f"{base.__name__}.{name}" for base, names in REQUIRED.items() for name in names
                   if getattr(type(_part_of(family, base)), name) is getattr(base, name)]
        assert missing == [], f"{family.id} does not implement {missing}"
        assert callable(family.keymap.recognizes) and callable(family.keymap.map_target)
        assert all(part.family is family for part in (family.layout, family.contracts, family.sampling))


def _part_of(family, base):
    return next(part for part in (family.layout, family.contracts, family.sampling) if isinstance(part, base))


# ModelFamily's own members: 48 before it was split into parts; the parts carry the rest
MAX_FAMILY_MEMBERS = 12


def own_members(cls) -> list:
    """The public attributes and methods a class defines itself (its fields among them), not inherited ones."""
    declared = set(vars(cls).get("__annotations__", {})) | set(vars(cls))
    return sorted(name for name in declared if not name.startswith("_"))


def test_the_family_interface_stays_small():
    members = own_members(ModelFamily)
    assert members == ["contracts", "has_audio", "id", "keymap", "layout", "model_families", "reference_scheduler",
                       "runs_stages", "sampling", "serves"]
    assert len(members) <= MAX_FAMILY_MEMBERS


def test_the_member_count_sees_a_method_added_to_the_class():
    grown = type("Grown", (ModelFamily,), {"encode_text": lambda self: None, "_private": 1,
                                           "__annotations__": {"audio_rate": int}})
    assert own_members(grown) == ["audio_rate", "encode_text"]


def test_a_part_belongs_to_one_family():
    layout = FamilyLayout()
    ModelFamily(id="a", model_families=("a",), layout=layout, keymap=None, contracts=FamilyContracts(),
                sampling=FamilySampling())
    with pytest.raises(ValueError, match="FamilyLayout already belongs to family 'a'"):
        ModelFamily(id="b", model_families=("b",), layout=layout, keymap=None, contracts=FamilyContracts(),
                    sampling=FamilySampling())


def test_roles_and_components_of_the_tiny_models(load_tiny, mm_models):
    wan22, wan21 = load_tiny("tiny-wan22-t2v"), load_tiny("tiny-wan21-t2v")
    qwen, minimax = load_tiny("tiny-qwen-image"), mm_models["plain"]
    roles = {model.name: families.family_for(model).layout.denoiser_roles(model) for model in (wan22, wan21, qwen, minimax)}
    assert roles == {
        "tiny-wan22-t2v": {"transformer": "high_noise_expert", "transformer_2": "low_noise_expert"},
        "tiny-wan21-t2v": {"transformer": "denoiser"},
        "tiny-qwen-image": {"transformer": "denoiser"},
        "tiny-minimax-h3": {"transformer": "denoiser", "transformer_ref": "denoiser"},
    }
    assert [families.has_expert_pair(m) for m in (wan22, wan21, qwen, minimax)] == [True, False, False, False]
    # what is known before loading: the roles of the index's components (planner and placement size by them)
    assert families.component_roles(minimax.model_index) == {
        "transformer": "denoiser", "transformer_ref": "alternate_denoiser", "vae": "vae", "audio_vae": "vae",
        "text_encoder": "text_encoder"}
    assert families.component_roles(wan22.model_index) == {
        "text_encoder": "text_encoder", "transformer": "high_noise_expert", "transformer_2": "low_noise_expert",
        "vae": "vae"}
    assert families.denoiser_components(minimax.model_index) == ["transformer", "transformer_ref"]
    assert [families.family_for(m).has_audio for m in (wan22, qwen, minimax)] == [False, False, True]


def test_a_family_refuses_a_source_kind_it_cannot_load(tmp_path):
    for family in families.all_families():
        with pytest.raises(ValueError, match="cannot load a 'gguf' source"):
            family.sampling.load_pipeline(PipelineSource(path=str(tmp_path), kind="gguf"))


def test_minimax_h3_refuses_single_files_saying_to_use_its_folder(tmp_path):
    with pytest.raises(ValueError, match="MiniMax-H3 does not load from single files; it runs from its diffusers "
                                         r"folder \(models/diffusers/, LoraBindModelLoader\)"):
        families.family_by_id("minimax_h3").sampling.load_pipeline(PipelineSource(path=str(tmp_path), kind="single_file"))


@pytest.mark.parametrize("name, experts", [("tiny-wan22-t2v", ["transformer", "transformer_2"]),
                                           ("tiny-qwen-image", ["transformer", "transformer"])])
@pytest.mark.slow
def test_every_denoiser_forward_goes_through_the_family(name, experts, load_tiny, monkeypatch):
    model = load_tiny(name)
    family = families.family_for(model)
    seen = []
    original = family.sampling.forward

    def recording_forward(model_, component, **inputs):
        seen.append(component)
        return original(model_, component, **inputs)

    monkeypatch.setattr(family.sampling, "forward", recording_forward)
    positive = generation.encode_text(model, "a cat")
    latent = generation.empty_latent(model, 32, 32, frames=1)
    schedule = SCHEDULE if name != "tiny-wan22-t2v" else ResolvedSchedule(
        sigmas=(1.0, 0.5, 0.0), steps=2, cfg=1.0, shift=5.0, boundary=0.875)
    generation.denoise(model, positive, None, latent, schedule, seed=0)
    assert seen == experts


@pytest.mark.slow
def test_minimax_forwards_go_through_the_family(mm_models, monkeypatch):
    model = mm_models["plain"]
    family = families.family_for(model)
    seen = []
    original = family.sampling.forward
    monkeypatch.setattr(family.sampling, "forward", lambda m, c, **inputs: seen.append(c) or original(m, c, **inputs))
    positive = generation.encode_text(model, "a cat")
    latent = generation.empty_latent(model, 32, 32, frames=1)
    schedule = ResolvedSchedule(sigmas=(1.0, 0.5, 0.0), audio_sigmas=(1.0, 0.5, 0.0), steps=2, cfg=1.0, shift=12.0,
                                task="t2va")
    generation.denoise(model, positive, None, latent, schedule, seed=0)
    assert seen == ["transformer", "transformer"]
