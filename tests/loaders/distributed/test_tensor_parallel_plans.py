"""The tensor-parallel plans the families give, checked without ranks: Wan's plan covers the layers of every
Wan block layout, a degree that does not divide the FFN width is refused by name, and a family without a plan
(MiniMax-H3) is refused by name."""

import pytest
import torch
from tensor_parallel_cases import wan_transformer

from lorabind.loaders.errors import ModelLoadError
from lorabind.loaders.families import family_by_id
from lorabind.loaders.models.tensor_parallel import check_splittable


def test_wan_plan_splits_both_attentions_the_image_branch_and_the_ffn():
    plan = family_by_id("wan2.2_moe").sampling.tensor_parallel_plan(wan_transformer("wan2.2-i2v"))
    assert plan.heads == 2 and plan.adapt is not None
    assert plan.linears["blocks.*.attn1.to_q"] == plan.linears["blocks.*.attn2.add_k_proj"] == "colwise"
    assert plan.linears["blocks.*.attn2.to_out.0"] == plan.linears["blocks.*.ffn.net.2"] == "rowwise"
    assert len(plan.linears) == 2 * 4 + 2 + 2  # q, k, v, out per attention; the image k, v; the FFN pair


def test_wan_plan_splits_the_vace_blocks_as_the_main_blocks():
    plan = family_by_id("wan2.1").sampling.tensor_parallel_plan(wan_transformer("vace"))
    main = {k.split(".", 1)[1]: v for k, v in plan.linears.items() if k.startswith("blocks.")}
    vace = {k.split(".", 1)[1]: v for k, v in plan.linears.items() if k.startswith("vace_blocks.")}
    assert main == vace and len(main) == 10


def test_a_degree_that_does_not_divide_the_ffn_width_is_refused_by_name():
    from diffusers import WanTransformer3DModel

    torch.manual_seed(0)
    odd_ffn = WanTransformer3DModel(patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=12,
                                    in_channels=16, out_channels=16, text_dim=32, freq_dim=256, ffn_dim=33,
                                    num_layers=1, qk_norm="rms_norm_across_heads")
    plan = family_by_id("wan2.1").sampling.tensor_parallel_plan(odd_ffn)
    with pytest.raises(ModelLoadError, match=r"wan2.1: --parallel tp=2 cannot split the denoiser: .*ffn.*33"):
        check_splittable(odd_ffn, plan, 2, "wan2.1")


def test_a_family_without_a_plan_is_refused_by_name():
    with pytest.raises(ModelLoadError, match=r"minimax_h3: --parallel tp cannot split .* no tensor-parallel plan"):
        family_by_id("minimax_h3").sampling.tensor_parallel_plan(torch.nn.Linear(2, 2))


def test_a_denoiser_with_gguf_weights_is_refused_by_name():
    denoiser = wan_transformer("wan2.1")
    weight = denoiser.get_submodule("blocks.0.ffn.net.2").weight
    weight.quant_type, weight.quant_shape = 8, tuple(weight.shape)  # what gguf_weights.is_quantized reads
    plan = family_by_id("wan2.1").sampling.tensor_parallel_plan(denoiser)
    with pytest.raises(ModelLoadError, match=r"wan2.1: --parallel tp cannot split weights stored as fp8 or GGUF "
                                             r"\('blocks.0.ffn.net.2.weight'\)"):
        check_splittable(denoiser, plan, 2, "wan2.1")


def test_a_tp_load_whose_memory_plan_moves_a_denoiser_is_refused_before_any_weight_is_read(tiny_models_root,
                                                                                            monkeypatch):
    from lorabind.loaders.distributed.spec import ParallelSpec
    from lorabind.loaders.errors import ModelLoadError
    from lorabind.loaders.models import store
    from lorabind.loaders.models.diffusers_folder import DiffusersFolder

    built = []
    monkeypatch.setattr(store, "session_spec", lambda: ParallelSpec(tp=2))
    monkeypatch.setattr(DiffusersFolder, "build", lambda self, dtype: built.append(dtype))
    with pytest.raises(ModelLoadError, match="tiny-wan22-t2v: --parallel tp keeps each rank's shard on its device, "
                                             "but the memory plan 'offload_model' places"):
        store.load_model(str(tiny_models_root / "diffusers" / "tiny-wan22-t2v"), memory="offload_model")
    assert built == []  # refused from the plan, before the folder was read
