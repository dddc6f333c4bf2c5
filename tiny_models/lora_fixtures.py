"""Synthetic LoRA fixtures for the built-in tiny models, under the REAL published file names and key layouts.

Why: contracts are declared by file name (``…lightx2v_4step…``, ``…Lightning-4steps…``) and the Wan2.2 expert
check reads ``high_noise``/``low_noise`` from it, so the offline fixtures must carry the names users download
(reference ``lora-formats-and-contracts.md`` §2.6) and the key layouts those files really use (§2.7: native Wan
module names under ``diffusion_model.``, ``lora_down``/``lora_up``, ``.alpha``, ``diff_b``, ``diff``, ``diff_m``).
Only the shapes are shrunk to the tiny models, read from the built folders' ``config.json``. Ranks keep the
published alpha/rank ratio (alpha 8 at rank 64 = 0.125). Weights are random but seeded: the bytes are the same
on every build, and an unchanged file is not rewritten (its mtime, and so every cache keyed on it, stays valid).
"""

from __future__ import annotations

import json
from pathlib import Path

from ..loaders.families.wan.slots import LOW_NOISE_EXPERT  # the low-noise expert's component name
from ..loaders.io.atomic_files import write_atomically
from ._common import FIXTURE_LORA_FOLDER, diffusers_dir
from .qwen_image import QWEN_IMAGE_NAME
from .qwen_image_edit import EDIT_PLUS_NAME
from .wan import WAN21_NAME, WAN22_NAME
from .wan_i2v import WAN21_I2V_NAME, WAN22_I2V_NAME

# Names relative to the loras root, as a workflow names them: the fixture folder + the published basename.
WAN22_HIGH = f"{FIXTURE_LORA_FOLDER}/wan2.2_t2v_A14b_high_noise_lora_rank64_lightx2v_4step_1217.safetensors"
WAN22_LOW = f"{FIXTURE_LORA_FOLDER}/wan2.2_t2v_A14b_low_noise_lora_rank64_lightx2v_4step_1217.safetensors"
WAN21_DISTILL = f"{FIXTURE_LORA_FOLDER}/wan2.1_t2v_14b_lora_rank64_lightx2v_4step.safetensors"
WAN22_I2V_HIGH = f"{FIXTURE_LORA_FOLDER}/wan2.2_i2v_A14b_high_noise_lora_rank64_lightx2v_4step_1022.safetensors"
WAN22_I2V_LOW = f"{FIXTURE_LORA_FOLDER}/wan2.2_i2v_A14b_low_noise_lora_rank64_lightx2v_4step_1022.safetensors"
WAN21_I2V_DISTILL = f"{FIXTURE_LORA_FOLDER}/wan2.1_i2v_lora_rank64_lightx2v_4step.safetensors"
QWEN_LIGHTNING = f"{FIXTURE_LORA_FOLDER}/Qwen-Image-Lightning-4steps-V1.0.safetensors"
# lightx2v/Qwen-Image-Edit-2511-Lightning's bf16 4-step file (reference §2.6), for the Edit-2511-shaped tiny Plus
QWEN_EDIT_LIGHTNING = f"{FIXTURE_LORA_FOLDER}/Qwen-Image-Edit-2511-Lightning-4steps-V1.0-bf16.safetensors"
PEFT_FOLDER = f"{FIXTURE_LORA_FOLDER}/tiny-wan21-style-peft"  # a user-trained PEFT adapter: no published name
FIXTURE_NAMES = (WAN22_HIGH, WAN22_LOW, WAN21_DISTILL, QWEN_LIGHTNING, PEFT_FOLDER, WAN22_I2V_HIGH, WAN22_I2V_LOW,
                 WAN21_I2V_DISTILL, QWEN_EDIT_LIGHTNING)

# The tiny model each fixture takes its shapes from: a prompt naming the fixture alone (the VACE example names the
# Wan2.1 T2V LoRA, not tiny-wan21-t2v) gets that model built first, or no fixture could be written.
FIXTURE_SOURCES = {WAN22_HIGH: WAN22_NAME, WAN22_LOW: WAN22_NAME, WAN21_DISTILL: WAN21_NAME, PEFT_FOLDER: WAN21_NAME,
                   WAN22_I2V_HIGH: WAN22_I2V_NAME, WAN22_I2V_LOW: WAN22_I2V_NAME, WAN21_I2V_DISTILL: WAN21_I2V_NAME,
                   QWEN_LIGHTNING: QWEN_IMAGE_NAME, QWEN_EDIT_LIGHTNING: EDIT_PLUS_NAME}
FIXTURE_RANK = 4
FIXTURE_ALPHA = 0.5  # 0.5 / 4 = 0.125 = the published 8 / 64
PEFT_RANK = 4
PEFT_ALPHA = 16  # lora_alpha != r on purpose: the case diffusers loads at the wrong scale
_METADATA = {"lorabind_fixture": "synthetic weights shaped for the lorabind tiny models; name and layout as published"}


def write_fixture_loras(models_root) -> list:
    """Write the fixtures into ``<models_root>/loras/lorabind-tiny/`` for each tiny model folder that exists;
    return the paths.

    Each fixture needs its model's config for the shapes, so a model that was not built gets no fixture.
    """
    lora_dir = Path(models_root) / "loras"
    lora_dir.mkdir(parents=True, exist_ok=True)
    models = diffusers_dir(models_root)
    written = []

    wan22 = models / WAN22_NAME
    if (wan22 / "transformer" / "config.json").is_file():
        written.append(save_fixture(lora_dir / WAN22_HIGH, wan_native_lora(_config(wan22, "transformer"), seed=101)))
        low_component = LOW_NOISE_EXPERT if (wan22 / LOW_NOISE_EXPERT / "config.json").is_file() else "transformer"
        written.append(save_fixture(lora_dir / WAN22_LOW, wan_native_lora(_config(wan22, low_component), seed=102)))

    wan21 = models / WAN21_NAME
    if (wan21 / "transformer" / "config.json").is_file():
        config = _config(wan21, "transformer")
        written.append(save_fixture(lora_dir / WAN21_DISTILL, wan_native_lora(config, seed=103)))
        written.extend(_save_peft_folder(lora_dir / PEFT_FOLDER, config, seed=104))

    # The I2V files carry the Wan2.1 CLIP image branch (k_img/v_img/norm_k_img/img_emb) even in the Wan2.2 pair,
    # whose experts have no such modules (LightX2V issue #1246): on Wan2.2 those keys are expected-unmatched.
    wan22_i2v = models / WAN22_I2V_NAME
    if (wan22_i2v / LOW_NOISE_EXPERT / "config.json").is_file():
        for name, component, seed in ((WAN22_I2V_HIGH, "transformer", 106), (WAN22_I2V_LOW, LOW_NOISE_EXPERT, 107)):
            config = {**_config(wan22_i2v, component), "image_dim": _I2V_FIXTURE_IMAGE_DIM}
            written.append(save_fixture(lora_dir / name, wan_native_lora(config, seed=seed)))

    wan21_i2v = models / WAN21_I2V_NAME
    if (wan21_i2v / "transformer" / "config.json").is_file():
        written.append(save_fixture(lora_dir / WAN21_I2V_DISTILL,
                                    wan_native_lora(_config(wan21_i2v, "transformer"), seed=108)))

    qwen = models / QWEN_IMAGE_NAME
    if (qwen / "transformer" / "config.json").is_file():
        lightning = _qwen_lightning_lora(_config(qwen, "transformer"), seed=105)
        written.append(save_fixture(lora_dir / QWEN_LIGHTNING, lightning))
    edit_plus = models / EDIT_PLUS_NAME
    if (edit_plus / "transformer" / "config.json").is_file():
        lightning = _qwen_lightning_lora(_config(edit_plus, "transformer"), seed=109)
        written.append(save_fixture(lora_dir / QWEN_EDIT_LIGHTNING, lightning))
    return written


def _config(model_dir: Path, component: str) -> dict:
    return json.loads((model_dir / component / "config.json").read_text(encoding="utf-8"))


# Image width of the CLIP branch written into the Wan2.2 I2V pair, whose experts have no image branch to read it
# from (the real files carry Wan2.1's 1280-wide one).
_I2V_FIXTURE_IMAGE_DIM = 16


def wan_native_lora(config: dict, seed: int, *, rank: int = FIXTURE_RANK, alpha: float = FIXTURE_ALPHA, dtype=None,
                    factor_std: float = 0.5, diff_std: float = 0.02) -> dict:
    """lightx2v layout (reference §2.7) on a WanTransformer3DModel config: per block self/cross attention and FFN
    pairs with ``.alpha`` and ``.diff_b``, norm ``.diff``s, ``norm3`` diff/diff_b, ``diff_m`` (modulation), plus the
    global ``head.head`` / embedding pairs without alpha (as in the published files). With an ``image_dim`` in the
    config, also the I2V image branch: ``cross_attn.{k_img,v_img}`` pairs, ``norm_k_img`` and ``img_emb.proj``.

    The one writer of this layout: the tiny fixtures use the defaults (float32, rank 4); the real-size bench asks
    for the published file's rank 64 in bfloat16 (``dtype``; None keeps float32) on the real config."""
    import torch

    dim = config["num_attention_heads"] * config["attention_head_dim"]
    patch = config["patch_size"]
    out = config["out_channels"] * patch[0] * patch[1] * patch[2]
    ffn, text, freq = config["ffn_dim"], config["text_dim"], config["freq_dim"]
    image_dim = config.get("image_dim")
    g = torch.Generator().manual_seed(seed)
    sd: dict = {}

    def randn(*shape, std):
        value = torch.randn(*shape, generator=g) * std
        return value if dtype is None else value.to(dtype)

    def diff(*shape):
        return randn(*shape, std=diff_std)

    def pair(name, in_f, out_f, with_alpha=True):
        sd[f"{name}.lora_down.weight"] = randn(rank, in_f, std=factor_std)
        sd[f"{name}.lora_up.weight"] = randn(out_f, rank, std=factor_std)
        if with_alpha:
            sd[f"{name}.alpha"] = torch.tensor(alpha, dtype=dtype)
        sd[f"{name}.diff_b"] = diff(out_f)

    for i in range(config["num_layers"]):
        block = f"diffusion_model.blocks.{i}"
        for attn in ("self_attn", "cross_attn"):
            for proj in ("q", "k", "v", "o"):
                pair(f"{block}.{attn}.{proj}", dim, dim)
            sd[f"{block}.{attn}.norm_q.diff"] = diff(dim)
            sd[f"{block}.{attn}.norm_k.diff"] = diff(dim)
        if image_dim:
            for proj in ("k_img", "v_img"):
                pair(f"{block}.cross_attn.{proj}", dim, dim)
            sd[f"{block}.cross_attn.norm_k_img.diff"] = diff(dim)
        pair(f"{block}.ffn.0", dim, ffn)
        pair(f"{block}.ffn.2", ffn, dim)
        if config.get("cross_attn_norm", True):
            sd[f"{block}.norm3.diff"] = diff(dim)
            sd[f"{block}.norm3.diff_b"] = diff(dim)
        sd[f"{block}.diff_m"] = diff(1, 6, dim)
    pair("diffusion_model.head.head", dim, out, with_alpha=False)
    pair("diffusion_model.text_embedding.0", text, dim, with_alpha=False)
    pair("diffusion_model.text_embedding.2", dim, dim, with_alpha=False)
    pair("diffusion_model.time_embedding.0", freq, dim, with_alpha=False)
    pair("diffusion_model.time_embedding.2", dim, dim, with_alpha=False)
    pair("diffusion_model.time_projection.1", dim, 6 * dim, with_alpha=False)
    if image_dim:
        pair("diffusion_model.img_emb.proj.1", image_dim, image_dim, with_alpha=False)
        pair("diffusion_model.img_emb.proj.3", image_dim, dim, with_alpha=False)
    return sd


def _qwen_lightning_lora(config: dict, seed: int) -> dict:
    """Qwen-Image-Lightning layout: bare diffusers module names (``transformer_blocks.N.attn.to_q``),
    ``lora_down``/``lora_up`` and a per-pair ``.alpha`` — the layout diffusers' Qwen converter expects for these
    files (reference §4.2). Attention projections and both MLPs of every block."""
    import torch

    dim = config["num_attention_heads"] * config["attention_head_dim"]
    hidden = 4 * dim  # diffusers' FeedForward default mult for the Qwen-Image blocks
    g = torch.Generator().manual_seed(seed)
    sd: dict = {}
    shapes = {
        "attn.to_q": (dim, dim), "attn.to_k": (dim, dim), "attn.to_v": (dim, dim), "attn.to_out.0": (dim, dim),
        "attn.add_q_proj": (dim, dim), "attn.add_k_proj": (dim, dim), "attn.add_v_proj": (dim, dim),
        "attn.to_add_out": (dim, dim),
        "img_mlp.net.0.proj": (dim, hidden), "img_mlp.net.2": (hidden, dim),
        "txt_mlp.net.0.proj": (dim, hidden), "txt_mlp.net.2": (hidden, dim),
    }
    for i in range(config["num_layers"]):
        for module, (in_f, out_f) in shapes.items():
            name = f"transformer_blocks.{i}.{module}"
            sd[f"{name}.lora_down.weight"] = torch.randn(FIXTURE_RANK, in_f, generator=g) * 0.5
            sd[f"{name}.lora_up.weight"] = torch.randn(out_f, FIXTURE_RANK, generator=g) * 0.5
            sd[f"{name}.alpha"] = torch.tensor(FIXTURE_ALPHA)
    return sd


def _save_peft_folder(folder: Path, config: dict, seed: int) -> list:
    """A PEFT adapter folder (``adapter_config.json`` + ``adapter_model.safetensors``) on the diffusers names of
    a Wan transformer, attention projections only (dynamic adapters carry no full diffs)."""
    import torch

    dim = config["num_attention_heads"] * config["attention_head_dim"]
    g = torch.Generator().manual_seed(seed)
    targets = ("to_q", "to_k", "to_v", "to_out.0")
    sd: dict = {}
    for i in range(config["num_layers"]):
        for attn in ("attn1", "attn2"):
            for proj in targets:
                name = f"base_model.model.blocks.{i}.{attn}.{proj}"
                sd[f"{name}.lora_A.weight"] = torch.randn(PEFT_RANK, dim, generator=g) * 0.5
                sd[f"{name}.lora_B.weight"] = torch.randn(dim, PEFT_RANK, generator=g) * 0.5
    adapter_config = {
        "peft_type": "LORA",
        "r": PEFT_RANK,
        "lora_alpha": PEFT_ALPHA,
        "target_modules": list(targets),
        "lora_dropout": 0.0,
        "bias": "none",
        "use_rslora": False,
        "base_model_name_or_path": WAN21_NAME,
    }
    folder.mkdir(parents=True, exist_ok=True)
    config_path = folder / "adapter_config.json"
    _write_if_changed(config_path, (json.dumps(adapter_config, indent=2, sort_keys=True) + "\n").encode("utf-8"))
    return [save_fixture(folder / "adapter_model.safetensors", sd), config_path]


def save_fixture(path: Path, state_dict: dict, metadata: dict = _METADATA) -> Path:
    """Write a fixture safetensors file (atomically, and only when its bytes change); return ``path``."""
    from safetensors.torch import save

    tensors = {key: value.contiguous() for key, value in state_dict.items()}
    _write_if_changed(path, save(tensors, metadata=metadata))
    return path


def _write_if_changed(path: Path, data: bytes) -> None:
    """Atomic write (temp file + rename) skipped when the file already holds exactly these bytes."""
    if path.is_file() and path.read_bytes() == data:
        return
    path.parent.mkdir(parents=True, exist_ok=True)  # the fixture folder (or a PEFT folder) inside the loras root
    write_atomically(str(path), lambda temp_path: Path(temp_path).write_bytes(data))
