"""Helpers shared by the loaders_patching tests: tiny Wan transformer recipe, synthetic canonical LoRA targets."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from lorabind.loaders.lora.canonical import LowRankDelta, TargetPatch

# dims of the tiny Wan transformer below (same recipe as the team's feasibility script tiny_wan.py)
DIM, FFN, TEXT_DIM = 24, 32, 32
BLOCK_LINEARS = ("attn1.to_q", "attn1.to_k", "attn1.to_v", "attn1.to_out.0",
                 "attn2.to_q", "attn2.to_k", "attn2.to_v", "attn2.to_out.0", "ffn.net.0.proj", "ffn.net.2")


def build_tiny_wan_transformer(seed: int = 0):
    from diffusers import WanTransformer3DModel

    torch.manual_seed(seed)
    return WanTransformer3DModel(
        patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=12, in_channels=16, out_channels=16,
        text_dim=TEXT_DIM, freq_dim=256, ffn_dim=FFN, num_layers=2, cross_attn_norm=True,
        qk_norm="rms_norm_across_heads", rope_max_seq_len=32,
    ).eval()


def random_low_rank(module, rank, seed, alpha=None, dtype=torch.float32):
    """A LowRankDelta fitting ``module.weight`` (linear or conv), with the scale alpha/rank (1 without alpha)."""
    g = torch.Generator().manual_seed(seed)
    weight = module.weight
    out_f = weight.shape[0]
    down = torch.randn((rank,) + tuple(weight.shape[1:]), generator=g) * 0.1
    up = torch.randn((out_f, rank) + (1,) * (weight.dim() - 2), generator=g) * 0.1
    scale = alpha / rank if alpha is not None else 1.0
    return LowRankDelta(down=down.to(dtype), up=up.to(dtype), alpha=alpha, scale=scale)


def make_targets(model, modules, *, rank=4, alpha=8.0, seed=0, bias=False, dtype=torch.float32):
    """Canonical targets on ``modules`` of ``model``: low-rank deltas, optionally with a bias diff."""
    targets = {}
    for i, path in enumerate(modules):
        module = model.get_submodule(path)
        diffs = {}
        if bias:
            g = torch.Generator().manual_seed(seed * 1000 + i + 500)
            diffs["bias"] = (torch.randn(module.bias.shape, generator=g) * 0.01).to(dtype)
        targets[path] = TargetPatch(module=path, low_rank=random_low_rank(module, rank, seed * 1000 + i, alpha, dtype),
                                    param_diffs=diffs)
    return targets


def block_modules(blocks=(0, 1), names=BLOCK_LINEARS):
    return [f"blocks.{b}.{n}" for b in blocks for n in names]


def snapshot(module):
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


def assert_bit_identical(before, module):
    after = module.state_dict()
    assert set(after) == set(before)
    differing = [k for k in before if not torch.equal(before[k], after[k])]
    assert differing == []


def write_diffusers_lora(path, targets, *, alpha=None, prefix="transformer."):
    """Save canonical targets as a diffusers-named LoRA file (``lora_A``/``lora_B`` + ``.alpha`` + ``diff_b``)."""
    from safetensors.torch import save_file

    tensors = {}
    for module, target in targets.items():
        if target.low_rank is not None:
            tensors[f"{prefix}{module}.lora_A.weight"] = target.low_rank.down.contiguous()
            tensors[f"{prefix}{module}.lora_B.weight"] = target.low_rank.up.contiguous()
            if alpha is not None:
                tensors[f"{prefix}{module}.alpha"] = torch.tensor(float(alpha))
        for param, diff in target.param_diffs.items():
            suffix = {"weight": "diff", "bias": "diff_b"}[param]
            tensors[f"{prefix}{module}.{suffix}"] = diff.contiguous()
    save_file(tensors, str(path))
    return str(path)


def tiny_inputs(seed=0):
    """Fixed inputs for one forward pass of the tiny Wan transformer."""
    g = torch.Generator().manual_seed(seed)
    return dict(hidden_states=torch.randn(1, 16, 2, 4, 4, generator=g), timestep=torch.tensor([500.0]),
                encoder_hidden_states=torch.randn(1, 6, TEXT_DIM, generator=g), return_dict=False)


def forward(model, seed=0):
    inputs = tiny_inputs(seed)
    dtype = next(model.parameters()).dtype
    inputs = {k: v.to(dtype) if isinstance(v, torch.Tensor) and v.is_floating_point() else v for k, v in inputs.items()}
    with torch.no_grad():
        return model(**inputs)[0].float()


# LightX2V/ComfyUI ("native Wan") module names -> diffusers module paths, written out by hand from the
# diffusers WanTransformer3DModel source: the test's independent expectation of where each key must land.
NATIVE_TO_DIFFUSERS = {
    "self_attn.q": "attn1.to_q", "self_attn.k": "attn1.to_k", "self_attn.v": "attn1.to_v",
    "self_attn.o": "attn1.to_out.0", "cross_attn.q": "attn2.to_q", "cross_attn.k": "attn2.to_k",
    "cross_attn.v": "attn2.to_v", "cross_attn.o": "attn2.to_out.0", "ffn.0": "ffn.net.0.proj", "ffn.2": "ffn.net.2",
    "self_attn.norm_q": "attn1.norm_q", "self_attn.norm_k": "attn1.norm_k", "cross_attn.norm_q": "attn2.norm_q",
    "cross_attn.norm_k": "attn2.norm_k", "norm3": "norm2",
    "head.head": "proj_out", "text_embedding.0": "condition_embedder.text_embedder.linear_1",
    "text_embedding.2": "condition_embedder.text_embedder.linear_2",
    "time_embedding.0": "condition_embedder.time_embedder.linear_1",
    "time_embedding.2": "condition_embedder.time_embedder.linear_2", "time_projection.1": "condition_embedder.time_proj",
}
BLOCK_PAIRS = ("self_attn.q", "self_attn.k", "self_attn.v", "self_attn.o", "cross_attn.q", "cross_attn.k",
               "cross_attn.v", "cross_attn.o", "ffn.0", "ffn.2")
GLOBAL_PAIRS = ("head.head", "text_embedding.0", "text_embedding.2", "time_embedding.0", "time_embedding.2",
                "time_projection.1")


def lightx2v_lora(model, *, rank=4, alpha=8.0, seed=0, full=False, modulation=True, dtype=torch.float32):
    """A LightX2V-style file (``diffusion_model.`` prefix, ``lora_down/up``, ``.alpha``, ``diff_b``) for ``model``.

    ``full`` adds what diffusers drops or rejects: norm diffs, ``diff_m`` (modulation, unless ``modulation``
    is False), a full-rank ``diff``, and global layers (``head.head`` with an alpha). Returns (tensors, expected) where expected maps a diffusers
    parameter name to ``(kind, tensors...)`` for an independent reference.
    """
    g = torch.Generator().manual_seed(seed)
    tensors, expected = {}, {}

    def pair(native, diffusers_path, with_alpha):
        weight = model.get_submodule(diffusers_path).weight
        down = torch.randn(rank, weight.shape[1], generator=g) * 0.1
        up = torch.randn(weight.shape[0], rank, generator=g) * 0.1
        bias = torch.randn(weight.shape[0], generator=g) * 0.01
        tensors[f"diffusion_model.{native}.lora_down.weight"] = down
        tensors[f"diffusion_model.{native}.lora_up.weight"] = up
        tensors[f"diffusion_model.{native}.diff_b"] = bias
        if with_alpha:
            tensors[f"diffusion_model.{native}.alpha"] = torch.tensor(float(alpha))
        expected[f"{diffusers_path}.weight"] = ("low_rank", up, down, alpha / rank if with_alpha else 1.0)
        expected[f"{diffusers_path}.bias"] = ("diff", bias)

    def diff(native_key, diffusers_param, shape):
        value = torch.randn(shape, generator=g) * 0.01
        tensors[f"diffusion_model.{native_key}"] = value
        expected[diffusers_param] = ("diff", value)

    for b in range(len(model.blocks)):
        for name in BLOCK_PAIRS:
            pair(f"blocks.{b}.{name}", f"blocks.{b}.{NATIVE_TO_DIFFUSERS[name]}", True)
        if full:
            for norm in ("self_attn.norm_q", "self_attn.norm_k", "cross_attn.norm_q", "cross_attn.norm_k"):
                diff(f"blocks.{b}.{norm}.diff", f"blocks.{b}.{NATIVE_TO_DIFFUSERS[norm]}.weight", (DIM,))
            diff(f"blocks.{b}.norm3.diff", f"blocks.{b}.norm2.weight", (DIM,))
            diff(f"blocks.{b}.norm3.diff_b", f"blocks.{b}.norm2.bias", (DIM,))
            if modulation:
                diff(f"blocks.{b}.diff_m", f"blocks.{b}.scale_shift_table",
                     tuple(model.blocks[b].scale_shift_table.shape))
    if full:
        for name in GLOBAL_PAIRS:
            pair(name, NATIVE_TO_DIFFUSERS[name], name == "head.head")
        expected.pop("blocks.0.attn1.to_q.weight")  # a full-rank diff instead of the pair on this one layer
        for suffix in ("lora_down.weight", "lora_up.weight", "alpha"):
            tensors.pop(f"diffusion_model.blocks.0.self_attn.q.{suffix}")
        diff("blocks.0.self_attn.q.diff", "blocks.0.attn1.to_q.weight", (DIM, DIM))
    return {k: v.to(dtype).contiguous() for k, v in tensors.items()}, expected


def expected_value(base, spec, strength):
    """float64 reference for one parameter: base + strength · (scale · up @ down | diff)."""
    if spec[0] == "low_rank":
        _, up, down, scale = spec
        return base.double() + strength * scale * (up.double() @ down.double())
    return base.double() + strength * spec[1].double().reshape(base.shape)


class LiveTensorBytes:
    """Peak bytes of tensor storage allocated (and still alive) inside a ``with`` block.

    A ``TorchDispatchMode`` sees every tensor an op returns; a storage the op allocated (not one of its inputs':
    in-place ops and views such as ``detach``/``reshape`` return those) is counted until its tensor is
    garbage-collected. This measures what a fuse or merge really holds at once (backups, float32 temporaries,
    loaded shards), independent of the process's allocator and RSS noise.
    """

    def __init__(self):
        import weakref

        from torch.utils._python_dispatch import TorchDispatchMode
        from torch.utils._pytree import tree_leaves

        tracker = self
        self.live = self.peak = 0
        self._sizes: dict = {}

        class _Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                out = func(*args, **(kwargs or {}))
                inputs = {t.untyped_storage().data_ptr() for t in tree_leaves((args, kwargs))
                          if isinstance(t, torch.Tensor) and t.device.type != "meta"}
                for tensor in tree_leaves(out):
                    if isinstance(tensor, torch.Tensor) and tensor.device.type != "meta":
                        storage = tensor.untyped_storage()
                        pointer = storage.data_ptr()
                        if pointer and pointer not in inputs and pointer not in tracker._sizes:
                            tracker._sizes[pointer] = storage.nbytes()
                            tracker.live += storage.nbytes()
                            tracker.peak = max(tracker.peak, tracker.live)
                            weakref.finalize(tensor, tracker._free, pointer)
                return out

        self._mode = _Mode()

    def _free(self, pointer):
        self.live -= self._sizes.pop(pointer, 0)

    def __enter__(self):
        self._mode.__enter__()
        return self

    def __exit__(self, *exc):
        return self._mode.__exit__(*exc)


def assert_fault_mid_fuse_leaves_base(model, applied: dict, key: str) -> None:
    """Fuse ``applied`` (module path -> TargetPatch) into ``model`` with an interrupt raised before the second
    layer: the apply must raise, and every tensor of the model must hold its base value bit for bit."""
    import pytest

    from lorabind.loaders.binding.patching import PatchLayer, WeightPatcher

    before = {k: v.detach().clone() for k, v in model.state_dict().items()}
    patcher = WeightPatcher({"transformer": model})
    calls = []

    def interrupt():
        calls.append(1)
        if len(calls) > 1:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        patcher.apply([PatchLayer(key, "transformer", 1.0, applied)], check_interrupt=interrupt)
    assert len(calls) == 2 and patcher.patched == set()
    for name, value in model.state_dict().items():
        assert torch.equal(value, before[name]), name


def write_component_folder(root, name: str, tensors: dict) -> str:
    """A bare diffusers model folder: one ``transformer`` component and the model_index.json every diffusers
    folder has (extract and merge find the main denoiser there)."""
    from safetensors.torch import save_file

    folder = Path(root) / name
    (folder / "transformer").mkdir(parents=True)
    save_file(tensors, str(folder / "transformer" / "diffusion_pytorch_model.safetensors"))
    (folder / "model_index.json").write_text(json.dumps(
        {"_class_name": "WanPipeline", "transformer": ["diffusers", "WanTransformer3DModel"]}))
    return str(folder)
