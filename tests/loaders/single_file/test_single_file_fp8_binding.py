"""Binding over fp8 single files: a distill pair fused into fp8 experts is computed in float32 and rounded once
(nearest by default, or seeded stochastic rounding), unbinding leaves the fp8 bytes identical to the file, and
peft adapters run over fp8 storage without touching it."""

import pytest
import torch
from safetensors import safe_open

from lorabind.loaders import fp8
from lorabind.loaders.binding import bind as binding
from lorabind.loaders.families import family_by_id
from lorabind.loaders.families.wan.key_layouts import WAN_TRANSFORMER
from lorabind.loaders.handles import AdapterSpec, FuseSpec
from lorabind.loaders.models.single_file.pipelines import detect_set, load_single_files
from lorabind.loaders.models.store import clear_cache
from lorabind.tiny_models.lora_fixtures import PEFT_FOLDER, WAN22_HIGH, WAN22_LOW
from lorabind.tiny_models.single_files import SUBFOLDER

EXPERTS = {"transformer": "wan2.2_t2v_high_noise_tiny_fp8_scaled.safetensors",
           "transformer_2": "wan2.2_t2v_low_noise_tiny_fp8_scaled.safetensors"}


@pytest.fixture
def root(single_file_root):
    yield single_file_root
    clear_cache()  # every test starts from the files' own bytes


def _model(root, rounding):
    models = root / "diffusion_models" / SUBFOLDER
    files = detect_set([(str(models / name), name) for name in EXPERTS.values()],
                       (str(root / "vae" / SUBFOLDER / "wan_2.1_vae_tiny.safetensors"), "vae"),
                       (str(root / "text_encoders" / SUBFOLDER / "umt5_tiny_bf16.safetensors"), "te"))
    return load_single_files(files, dtype="bfloat16", fp8_rounding=rounding)


def _fp8_bytes(model) -> dict:
    return {(component, name.replace(".base_layer", "")): p.detach().view(torch.uint8).clone()
            for component, module in model.components.items()
            for name, p in module.named_parameters() if p.dtype == torch.float8_e4m3fn}


def _file_bytes(root) -> dict:
    out = {}
    for component, file_name in EXPERTS.items():
        with safe_open(str(root / "diffusion_models" / SUBFOLDER / file_name), "pt") as handle:
            for key in handle.keys():
                tensor = handle.get_tensor(key)
                if tensor.dtype == torch.float8_e4m3fn and key != "scaled_fp8":
                    out[(component, WAN_TRANSFORMER.to_diffusers(key))] = tensor.view(torch.uint8)
    return out


def _fuses(root):
    loras = root / "loras"
    return [FuseSpec(str(loras / WAN22_HIGH), 1.0, "transformer", WAN22_HIGH),
            FuseSpec(str(loras / WAN22_LOW), 1.0, "transformer_2", WAN22_LOW)]


def _expected_nearest(root, model, component, name) -> torch.Tensor:
    """float32(fp8 x scale) + strength x scale x up @ down, / scale, rounded once to nearest."""
    from lorabind.loaders.lora.mapping import map_to_model
    from lorabind.loaders.lora.reader import read_lora

    module_path = name.rsplit(".", 1)[0]
    lora = map_to_model(read_lora(str(root / "loras" / (WAN22_HIGH if component == "transformer" else WAN22_LOW))),
                        model.family, family_by_id(model.family))
    target = lora.targets[module_path]
    delta = target.low_rank
    entry = fp8.stored_weight(model.components[component].get_submodule(module_path), "weight")
    file_weight = _file_tensor(root, component, name)
    value = file_weight.float() * entry.scale + float(delta.scale) * (delta.up.float() @ delta.down.float())
    return (value / entry.scale).clamp(-448, 448).to(torch.float8_e4m3fn)


def _file_tensor(root, component, name):
    with safe_open(str(root / "diffusion_models" / SUBFOLDER / EXPERTS[component]), "pt") as handle:
        return handle.get_tensor(WAN_TRANSFORMER.to_native(name))


def test_fp8_weights_load_as_the_files_bytes(root):
    model = _model(root, "nearest")
    loaded, in_file = _fp8_bytes(model), _file_bytes(root)
    assert loaded.keys() == in_file.keys() and len(loaded) > 10
    assert all(torch.equal(loaded[k], in_file[k]) for k in loaded)


@pytest.mark.parametrize("rounding", ["nearest", "stochastic"])
def test_distill_pair_fused_into_fp8_experts_then_unbound_leaves_the_file_bytes(root, rounding):
    model = _model(root, rounding)
    binding.bind(model, _fuses(root), [])
    fused = _fp8_bytes(model)
    in_file = _file_bytes(root)
    changed = [k for k in fused if not torch.equal(fused[k], in_file[k])]
    assert len(changed) >= 8, "the distill pair must have changed fp8 weights of both experts"
    assert {component for component, _ in changed} == {"transformer", "transformer_2"}
    component, name = next(k for k in changed if k[1].endswith("attn1.to_q.weight"))
    expected = _expected_nearest(root, model, component, name).view(torch.uint8)
    if rounding == "nearest":
        assert torch.equal(fused[(component, name)], expected)
    else:  # one fp8 step from nearest at most, and the same bytes on every fuse (seeded per tensor)
        steps = (fused[(component, name)].to(torch.int16) - expected.to(torch.int16)).abs()
        assert steps.max().item() <= 1 and steps.sum().item() > 0
        binding.unbind(model)
        binding.bind(model, _fuses(root), [])
        assert all(torch.equal(_fp8_bytes(model)[k], fused[k]) for k in fused)
    # the originals are re-read from the files (h11plan's file-backed restore), not kept as RAM copies
    sources = model.binding_state.patcher.restore_sources()
    assert sources["transformer"]["file"] > 0 and sources["transformer_2"]["file"] > 0
    assert sources["transformer"]["ram"] == 0 and sources["transformer_2"]["ram"] == 0
    binding.unbind(model)
    restored = _fp8_bytes(model)
    assert all(torch.equal(restored[k], in_file[k]) for k in in_file)


@pytest.mark.slow
def test_peft_adapter_runs_over_fp8_storage_without_touching_it(root):

    model = _model(root, "nearest")
    before = _fp8_bytes(model)
    transformer = model.components["transformer"]
    torch.manual_seed(0)
    x = torch.randn(1, 16, 1, 4, 4, dtype=torch.bfloat16)
    inputs = dict(hidden_states=x, timestep=torch.tensor([500.0]),
                  encoder_hidden_states=torch.randn(1, 4, 32, dtype=torch.bfloat16), return_dict=False)
    plain = transformer(**inputs)[0]
    binding.bind(model, [], [AdapterSpec(str(root / "loras" / PEFT_FOLDER), 1.0, "transformer", PEFT_FOLDER)])
    adapted = transformer(**inputs)[0]
    assert not torch.equal(plain, adapted)
    lora_dtypes = {p.dtype for n, p in transformer.named_parameters() if "lora_" in n}
    assert lora_dtypes and torch.float8_e4m3fn not in lora_dtypes
    assert all(torch.equal(_fp8_bytes(model)[k], before[k]) for k in before)
    assert fp8.stored_weights(transformer)  # still fp8-stored under the peft wrappers
    binding.unbind(model)
    assert torch.equal(transformer(**inputs)[0], plain)
