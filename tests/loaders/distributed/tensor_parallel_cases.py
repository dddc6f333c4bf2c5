"""What each rank of the tensor-parallel tests runs (spawned by ``gloo_ranks``): one tiny denoiser built alike
on both ranks, its output and a LoRA fuse unsharded, then the same after ``apply_tensor_parallel`` with tp=2.

Why one function per model and every measurement in it: a spawned rank costs seconds of imports, so each model
is split once and every check reads what that run measured.
"""

from __future__ import annotations

import types

import torch

from lorabind.loaders.binding.patching import PatchLayer, WeightPatcher
from lorabind.loaders.lora.canonical import TargetPatch
from lorabind.loaders.lora.kinds.loha import LohaDelta
from lorabind.loaders.lora.kinds.low_rank import LowRankDelta
from lorabind.loaders.models.tensor_parallel import apply_tensor_parallel

COMPONENT = "transformer"


def wan_transformer(variant: str):
    """The tiny Wan2.1 transformer (``tiny_models.wan``), the tiny VACE one (``vace_blocks`` split too) or a
    tiny Wan2.2 I2V expert (36 input channels), here with the Wan2.1-I2V image branch too, so its
    ``add_k_proj`` and ``norm_added_k`` are split and checked."""
    from lorabind.tiny_models.wan import tiny_transformer
    from lorabind.tiny_models.wan_i2v import CLIP_HIDDEN, I2V_IN_CHANNELS, LATENT_CHANNELS
    from lorabind.tiny_models.wan_vace import tiny_vace_transformer

    torch.manual_seed(2)
    if variant == "wan2.1":
        return tiny_transformer().eval()
    if variant == "vace":
        return tiny_vace_transformer().eval()
    return tiny_transformer(I2V_IN_CHANNELS, LATENT_CHANNELS, image_dim=CLIP_HIDDEN, added_kv_proj_dim=24).eval()


def wan_inputs(model) -> dict:
    generator = torch.Generator().manual_seed(7)
    config = model.config
    inputs = {"hidden_states": torch.randn(1, config.in_channels, 2, 8, 8, generator=generator),
              "encoder_hidden_states": torch.randn(1, 512, config.text_dim, generator=generator),
              "timestep": torch.tensor([500.0])}
    if config.image_dim is not None:  # the I2V image branch: its tokens come before the 512 text tokens
        inputs["encoder_hidden_states_image"] = torch.randn(1, 5, config.image_dim, generator=generator)
    if "vace_in_channels" in config:  # VACE: the control video its vace_blocks read
        inputs["control_hidden_states"] = torch.randn(1, config.vace_in_channels, 2, 8, 8, generator=generator)
    return inputs


def qwen_transformer(heads: int = 2):
    """The tiny Qwen-Image transformer (``tiny_models.qwen_image``) with ``heads`` heads (the tiny model has 3,
    which tp=2 cannot split: the refusal test uses that)."""
    from diffusers import QwenImageTransformer2DModel

    from lorabind.tiny_models.qwen_image import LATENT_CHANNELS, TEXT_DIM

    torch.manual_seed(2)
    return QwenImageTransformer2DModel(
        patch_size=2, in_channels=LATENT_CHANNELS * 4, out_channels=LATENT_CHANNELS, num_layers=2,
        attention_head_dim=16, num_attention_heads=heads, joint_attention_dim=TEXT_DIM, guidance_embeds=False,
        axes_dims_rope=(8, 4, 4)).eval()


def qwen_inputs(model) -> dict:
    generator = torch.Generator().manual_seed(7)
    return {"hidden_states": torch.randn(1, 16, model.config.in_channels, generator=generator),
            "encoder_hidden_states": torch.randn(1, 6, model.config.joint_attention_dim, generator=generator),
            "encoder_hidden_states_mask": torch.ones(1, 6, dtype=torch.long),
            "timestep": torch.tensor([0.5]), "img_shapes": [(1, 4, 4)]}


def loaded(model, family: str):
    """The ``LoadedModel`` fields ``apply_tensor_parallel`` reads."""
    return types.SimpleNamespace(family=family, components={COMPONENT: model}, binding_state=None)


def lora_layer(model, linears: dict, dtype=torch.float32) -> PatchLayer:
    """A LoRA on every planned linear of block 0: low-rank pairs on colwise and rowwise layers (one LoHa on a
    colwise and one on a rowwise layer), a bias diff on each. Seeded, so both ranks build the same. ``dtype``:
    the pairs' factors (bfloat16 on a bfloat16 model: the patcher's one-gemm path, ``fused_rows``)."""
    generator = torch.Generator().manual_seed(11)
    targets = {}
    for index, pattern in enumerate(linears):
        path = pattern.replace("*", "0")
        out_features, in_features = model.get_submodule(path).weight.shape
        bias_diff = {"bias": torch.randn(out_features, generator=generator) * 0.01}
        if index in (0, len(linears) - 1):
            factors = [torch.randn(shape, generator=generator) * 0.1
                       for shape in ((out_features, 3), (3, in_features), (out_features, 3), (3, in_features))]
            delta = LohaDelta(*factors, alpha=3.0, scale=1.0)
        else:
            delta = LowRankDelta(down=(torch.randn(4, in_features, generator=generator) * 0.1).to(dtype),
                                 up=(torch.randn(out_features, 4, generator=generator) * 0.1).to(dtype),
                                 alpha=8.0, scale=2.0)
        targets[path] = TargetPatch(module=path, low_rank=delta, param_diffs=bias_diff)
    return PatchLayer(key="case-lora", component=COMPONENT, strength=0.75, targets=targets, name="case-lora")


def run_case(rank: int, world_size: int, name: str) -> dict:
    """Everything a test checks for one model at tp=2, measured on this rank."""
    build, inputs_of, family, dtype = CASES[name]
    model = build().to(dtype)
    inputs = {k: v.to(dtype) if torch.is_tensor(v) and v.is_floating_point() else v for k, v in inputs_of(model).items()}
    plan_linears = _plan_linears(model, family)
    layer = lora_layer(model, plan_linears, dtype)
    with torch.no_grad():
        whole_output = model(**inputs, return_dict=False)[0]
    whole = WeightPatcher({COMPONENT: model})
    whole.apply([layer])
    names = sorted(f"{p}.{n}" for p in layer.targets for n in ("weight", "bias"))
    whole_fused = {n: model.get_parameter(n).detach().clone() for n in names}
    with torch.no_grad():
        whole_lora_output = model(**inputs, return_dict=False)[0]
    whole.restore_all()
    report = apply_tensor_parallel(loaded(model, family), world_size)[0]
    shards_before = {n: model.get_parameter(n).to_local().clone() for n in names}
    with torch.no_grad():
        split_output = model(**inputs, return_dict=False)[0]
    split = WeightPatcher({COMPONENT: model})
    split.apply([layer])
    fused = {n: model.get_parameter(n).to_local().clone() for n in names}
    with torch.no_grad():
        split_lora_output = model(**inputs, return_dict=False)[0]
    split.restore_all()
    restored = {n: torch.equal(model.get_parameter(n).to_local(), shards_before[n]) for n in names}
    return {"whole_output": whole_output, "split_output": split_output, "whole_lora_output": whole_lora_output,
            "split_lora_output": split_lora_output, "whole_fused": whole_fused, "fused": fused,
            "placements": {n: str(model.get_parameter(n).placements) for n in names}, "restored": restored,
            "report": (report.sharded_parameters, report.local_bytes, report.full_bytes),
            "heads": {n: m.heads for n, m in model.named_modules() if n.endswith(("attn1", "attn2", ".attn"))}}


def _plan_linears(model, family: str) -> dict:
    from lorabind.loaders.families import family_by_id

    return family_by_id(family).sampling.tensor_parallel_plan(model).linears


# name -> (build, inputs, LoadedModel.family, dtype)
CASES = {
    "wan2.1": (lambda: wan_transformer("wan2.1"), wan_inputs, "wan2.1", torch.float32),
    "wan2.2-i2v-expert": (lambda: wan_transformer("wan2.2-i2v"), wan_inputs, "wan2.2_moe", torch.float32),
    "qwen-image": (qwen_transformer, qwen_inputs, "qwen_image", torch.float32),
    "wan2.1-bf16": (lambda: wan_transformer("wan2.1"), wan_inputs, "wan2.1", torch.bfloat16),
    "wan2.1-vace": (lambda: wan_transformer("vace"), wan_inputs, "wan2.1", torch.float32),
}


def run_refusals(rank: int, world_size: int) -> dict:
    """The refusals under tp=2 (each message, and whether the shard was left as it was) and the cross-rank
    RMSNorm against ``torch.nn.RMSNorm``."""
    from lorabind.loaders.binding.peft_adapters import AdapterCache, cache_key, to_peft_groups
    from lorabind.loaders.lora.kinds.dora import DoraDelta
    from lorabind.loaders.lora.kinds.lokr import LokrDelta

    found = {"heads": _message(lambda: apply_tensor_parallel(loaded(qwen_transformer(heads=3), "qwen_image"), 2))}
    model = wan_transformer("wan2.1")
    apply_tensor_parallel(loaded(model, "wan2.1"), world_size)
    found["twice"] = _message(lambda: apply_tensor_parallel(loaded(model, "wan2.1"), world_size))
    to_q = model.get_submodule("blocks.0.attn1.to_q").weight
    before = to_q.to_local().clone()
    pair = LowRankDelta(down=torch.ones(2, 24) * 0.1, up=torch.ones(24, 2) * 0.1, alpha=None, scale=1.0)
    kinds = {"dora": ("blocks.0.attn1.to_q", DoraDelta(inner=pair, magnitude=torch.ones(24), peft_axis=True)),
             "lokr": ("blocks.0.attn1.to_out.0", LokrDelta(w1=(torch.ones(2, 2),), w2=(torch.ones(12, 12),),
                                                         alpha=None, scale=1.0))}
    for kind, (path, delta) in kinds.items():
        layer = PatchLayer(key=kind, component=COMPONENT, strength=1.0,
                           targets={path: TargetPatch(module=path, low_rank=delta)}, name=f"{kind}-file")
        found[kind] = _message(lambda layer=layer: WeightPatcher({COMPONENT: model}).apply([layer]))
    found["shard_untouched"] = torch.equal(to_q.to_local(), before)
    cache = AdapterCache({COMPONENT: model})
    groups = to_peft_groups({"blocks.0.attn1.to_q": TargetPatch(module="blocks.0.attn1.to_q", low_rank=pair)},
                            "peft-file")
    found["peft"] = _message(lambda: cache.ensure(cache_key(__file__, COMPONENT), COMPONENT, groups,
                                                  "peft-file"))
    found["norm_diff"] = _cross_rank_norm_diff(rank, world_size)
    return found


def _cross_rank_norm_diff(rank: int, world_size: int) -> float:
    """max |CrossRankRMSNorm(x's slice) - RMSNorm(x)'s slice| for Wan's eps over a 24-wide feature row."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh

    from lorabind.loaders.families.wan.cross_rank_norm import CrossRankRMSNorm

    torch.manual_seed(5)
    norm = torch.nn.RMSNorm(24, eps=1e-6)
    torch.nn.init.normal_(norm.weight)
    hidden = torch.randn(2, 7, 24) * 3
    mesh = DeviceMesh.from_group(dist.group.WORLD, "cpu", mesh_dim_names=("tp",))
    split = CrossRankRMSNorm(norm, mesh)
    width = 24 // world_size
    columns = slice(rank * width, (rank + 1) * width)
    with torch.no_grad():
        return float((split(hidden[..., columns]) - norm(hidden)[..., columns]).abs().max())


def _message(action) -> str:
    try:
        action()
    except Exception as exc:  # the test asserts the type through the text it names
        return f"{type(exc).__name__}: {exc}"
    return "no error"


def run_all(rank: int, world_size: int, models_root: str) -> dict:
    """Every case, the refusals and the loaded tiny Wan2.1 (``tensor_parallel_loaded``) in one spawn of the
    ranks (each spawn costs about 8 s of imports on 2 cores)."""
    from tensor_parallel_loaded import run_denoised, run_loaded

    results = {name: run_case(rank, world_size, name) for name in CASES}
    results["refusals"] = run_refusals(rank, world_size)
    results["loaded"] = run_loaded(rank, world_size, models_root)
    results["denoised"] = run_denoised(rank, world_size, models_root)
    return results
