"""Component sizes come from configs on the meta device and match what diffusers actually loads."""

import pytest


@pytest.fixture(scope="module")
def wan22_folder(tiny_models_root):
    return tiny_models_root / "diffusers" / "tiny-wan22-t2v"


def test_sizes_match_the_loaded_modules_parameter_for_parameter(wan22_folder):
    import torch
    from diffusers import DiffusionPipeline

    from lorabind.loaders.placement import component_sizes

    sizes = {s.name: s for s in component_sizes(wan22_folder, dtype="float32")}
    pipeline = DiffusionPipeline.from_pretrained(wan22_folder, local_files_only=True, torch_dtype=torch.float32)
    for name, size in sizes.items():
        module = getattr(pipeline, name)
        assert size.parameters == sum(p.numel() for p in module.parameters()), name
        weight_bytes = sum(t.numel() * t.element_size() for t in [*module.parameters(), *module.buffers()])
        assert size.bytes == weight_bytes, name
    roles = {name: s.role for name, s in sizes.items()}
    assert roles == {"transformer": "high_noise_expert", "transformer_2": "low_noise_expert",
                     "text_encoder": "text_encoder", "vae": "vae"}


def test_blocks_are_the_repeated_no_split_modules(wan22_folder):
    from lorabind.loaders.placement import component_sizes

    sizes = {s.name: s for s in component_sizes(wan22_folder, dtype="float32")}
    expert = sizes["transformer"]
    # two WanTransformerBlocks of equal size; the rest (embeddings, output head) stays outside the blocks
    assert expert.blocks_bytes == 2 * expert.largest_block_bytes
    assert 0 < expert.blocks_bytes < expert.bytes
    assert 0 < expert.largest_layer_bytes < expert.bytes


def test_bf16_keeps_diffusers_fp32_modules(wan22_folder):
    from lorabind.loaders.placement import component_sizes

    fp32 = {s.name: s for s in component_sizes(wan22_folder, dtype="float32")}
    bf16 = {s.name: s for s in component_sizes(wan22_folder, dtype="bfloat16")}
    # the UMT5 encoder halves exactly; the transformer keeps its norms / time embedder in float32
    assert bf16["text_encoder"].bytes * 2 == fp32["text_encoder"].bytes
    assert fp32["transformer"].bytes // 2 < bf16["transformer"].bytes < fp32["transformer"].bytes
