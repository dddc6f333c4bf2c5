"""Tiny MiniMax-H3 models and fixture LoRAs, built offline from configs with fixed seeds.

Two folders under ``<models_root>/diffusers``: ``tiny-minimax-h3`` (plain release: both DiT partitions
``transformer`` and ``transformer_ref``, video and audio VAEs, a tiny Qwen3 text encoder and a local word-level
tokenizer) and ``tiny-minimax-h3-pinned`` (same weights, but its ``model_index.json["_minimax_h3"]`` pins a
distilled ``base_schedule`` the way merged releases do). Shapes are the real model's in miniature, except the
head width: it stays 128 because the grouped fused-QKV layout of native LoRAs is defined per 128-row head.

``write_minimax_fixture_loras`` writes LoRA files with the REAL published file names, key layouts and metadata
(tiny rank), so name-based contracts, key maps and workflows are exercised on exactly what users download.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from ..loaders.io.safe_output import check_output, safe_output
from ..loaders.models.compat import require
from ..loaders.models.store import quiet_library_progress
from ._common import FIXTURE_LORA_FOLDER, WRITTEN_BY, diffusers_dir, finish_folder, fixture_lora_dir, seeded
from .lora_fixtures import save_fixture

TINY_NAME = "tiny-minimax-h3"
TINY_PINNED_NAME = "tiny-minimax-h3-pinned"
# The release block both tiny folders carry: references encoded at a 32-pixel short edge (the released model's
# 2048 would be 65536 rows per reference here), read like any other release setting.
TINY_RELEASE = {"reference_image_short_edge": 32}
PINNED_RELEASE = {
    **TINY_RELEASE,
    "partition": "fl2va",
    "tasks": ["t2va", "fl2va"],
    "sigma_shift_scales": {"video": 12.0, "audio": 3.0},
    "base_schedule": [1.0, 0.7, 0.4, 0.15, 0.0],
}

TRANSFORMER_CONFIG = dict(
    num_attention_heads=2,
    attention_head_dim=128,
    hidden_size=32,
    num_layers=2,
    num_refiner_layers=1,
    ffn_dim=48,
    in_channels=4,
    audio_in_channels=4,
    patch_size=(1, 2, 2),
    text_dim=16,
    freq_dim=32,
    time_embed_hidden_dim=32,
    time_embed_dim=16,
    rope_freq_dim=4,
)
# No temporal compression and one frame per chunk: latent frames = video frames, spatial ratio 4.
VIDEO_VAE_CONFIG = dict(
    latent_channels=4,
    block_out_channels=(8, 8),
    layers_per_block=1,
    spatial_downsample_factors=(2, 2),
    temporal_downsample_factors=(1, 1),
    norm_num_groups=4,
    decoder_num_layers=1,
    decoder_num_attention_heads=2,
    decoder_attention_head_dim=8,
    decoder_num_register_tokens=1,
    decoder_ffn_mult=1,
    clip_length=1,
    token_drop=0,
    latents_mean=(0.0,) * 4,
    latents_std=(1.0,) * 4,
)
# hop length 8 at 320 Hz = 40 latents per second, the real model's audio latent rate.
AUDIO_VAE_CONFIG = dict(
    encoder_dim=4,
    encoder_rates=(2, 4),
    latent_dim=16,
    latent_channels=4,
    num_attention_heads=2,
    decoder_dim=8,
    decoder_rates=(4, 2),
    decoder_kernel_sizes=(8, 4),
    resblock_kernel_sizes=(3,),
    resblock_dilation_sizes=((1,),),
    sampling_rate=320,
    latents_mean=[0.0] * 4,
    latents_std=[1.0] * 4,
)
VOCAB_WORDS = (
    "a cat dog bird dances sings runs in the rain sun city forest night music loud quiet video of on with "
    "blurry low quality noise"
).split()


def _tokenizer():
    """Word-level tokenizer built in memory (works on transformers 4.x and 5.x; nothing downloaded)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = ["<pad>", "<unk>", "<|endoftext|>"] + sorted(set(VOCAB_WORDS))
    vocab = {w: i for i, w in enumerate(words)}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token="<pad>", unk_token="<unk>", eos_token="<|endoftext|>"
    )


def _text_encoder(vocab_size: int):
    from transformers import Qwen3Config, Qwen3Model

    config = Qwen3Config(
        vocab_size=vocab_size,
        hidden_size=TRANSFORMER_CONFIG["text_dim"],
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=8,
        max_position_embeddings=128,
    )
    return Qwen3Model(config).eval()


def _component_entries() -> dict:
    return {
        "transformer": ["diffusers", "MiniMaxH3Transformer3DModel"],
        "transformer_ref": ["diffusers", "MiniMaxH3Transformer3DModel"],
        "vae": ["diffusers", "AutoencoderKLMiniMaxH3"],
        "audio_vae": ["diffusers", "AutoencoderKLMiniMaxH3Audio"],
        "scheduler": ["diffusers", "MiniMaxH3Scheduler"],
        "audio_scheduler": ["diffusers", "MiniMaxH3Scheduler"],
        "text_encoder": ["transformers", "Qwen3Model"],
        "tokenizer": ["transformers", "PreTrainedTokenizerFast"],
    }


def _write_base(folder: Path) -> None:
    import diffusers
    from diffusers import (
        AutoencoderKLMiniMaxH3,
        AutoencoderKLMiniMaxH3Audio,
        MiniMaxH3Scheduler,
        MiniMaxH3Transformer3DModel,
    )

    tokenizer = _tokenizer()
    factories = {
        "transformer": lambda: MiniMaxH3Transformer3DModel(**TRANSFORMER_CONFIG),
        "transformer_ref": lambda: MiniMaxH3Transformer3DModel(**TRANSFORMER_CONFIG),
        "vae": lambda: AutoencoderKLMiniMaxH3(**VIDEO_VAE_CONFIG),
        "audio_vae": lambda: AutoencoderKLMiniMaxH3Audio(**AUDIO_VAE_CONFIG),
        "text_encoder": lambda: _text_encoder(len(tokenizer)),
    }
    for seed, (name, factory) in enumerate(factories.items()):  # seeds 0..4, in this order
        with seeded(seed), quiet_library_progress():  # no shard bar, no weight_norm FutureWarning
            module = factory()
            module.save_pretrained(folder / name, safe_serialization=True)
    MiniMaxH3Scheduler(shift=12.0).save_pretrained(folder / "scheduler")
    MiniMaxH3Scheduler(shift=3.0).save_pretrained(folder / "audio_scheduler")
    tokenizer.save_pretrained(folder / "tokenizer")
    index = {"_class_name": "MiniMaxH3ModularPipeline", "_diffusers_version": diffusers.__version__}
    index.update(_component_entries())
    index["_minimax_h3"] = TINY_RELEASE
    (folder / "model_index.json").write_text(json.dumps(index, indent=2) + "\n")
    finish_folder(folder)


def build_tiny_minimax_h3(models_root) -> list[Path]:
    """Build both tiny MiniMax-H3 folders under ``models_root/diffusers``; return the folders written."""
    require("minimax_h3", "the built-in tiny MiniMax-H3 model")  # before any folder is removed or created
    root = diffusers_dir(models_root)
    plain, pinned = root / TINY_NAME, root / TINY_PINNED_NAME
    output = dict(overwrite=True, label="built-in model folder")
    for folder in (plain, pinned):  # both refused before either is written when one is not a built-in
        check_output(str(folder), **output)
    with safe_output(str(plain), written_by=WRITTEN_BY, **output) as staged:
        _write_base(Path(staged))
    with safe_output(str(pinned), written_by=WRITTEN_BY, **output) as staged:
        shutil.copytree(plain, staged, dirs_exist_ok=True)
        index = json.loads((Path(staged) / "model_index.json").read_text())
        index["_minimax_h3"] = PINNED_RELEASE
        (Path(staged) / "model_index.json").write_text(json.dumps(index, indent=2) + "\n")
    return [plain, pinned]


# ---------------------------------------------------------------------------------------------------------
# Fixture LoRAs with the published names (lightx2v/Minimax-h3-Turbo and FlashGen), sized for the tiny models.

FIXTURE_RANK = 4
NATIVE_FIXTURE_NAME = "minimax_h3_t2va_flashgen_4step_v1.0_768p_bf16.safetensors"
NATIVE_BASE_SCHEDULE = "1.0,0.7,0.4,0.15,0.0"
# name -> safetensors metadata, as published (alpha values are the published ones; see the reference §1.8.7)
TURBO_FIXTURES = {
    "minimax_h3_fl2v_turbo_4step_v0.1.safetensors": {},
    "minimax_h3_fl2v_turbo_4step_v1.0_768p_bf16.safetensors": {"key_format": "minimax-h3-diffusers", "alpha": "128"},
    "minimax_h3_fl2v_turbo_4step_v1.1_768p_bf16.safetensors": {"key_format": "minimax-h3-diffusers", "alpha": "128"},
    "minimax_h3_fl2v_turbo_4step_v1.2_768p_bf16.safetensors": {"key_format": "minimax-h3-diffusers", "alpha": "8"},
    "minimax_h3_fl2v_turbo_8step_v1.0_bf16.safetensors": {"alpha": "8"},
    "minimax_h3_fl2v_turbo_8step_v1.0_768p_bf16.safetensors": {"key_format": "minimax-h3-diffusers", "alpha": "8"},
    "minimax_h3_ref2v_turbo_4step_v0.1_bf16.safetensors": {},
    "minimax_h3_ref2v_turbo_8step_v1.0_768p_bf16.safetensors": {"key_format": "minimax-h3-diffusers", "alpha": "128"},
}


def _dims() -> dict:
    c = TRANSFORMER_CONFIG
    inner = c["num_attention_heads"] * c["attention_head_dim"]
    return {"hidden": c["hidden_size"], "inner": inner, "ffn": c["ffn_dim"], "temb": c["time_embed_dim"]}


def turbo_fixture_shapes() -> dict:
    """Diffusers-layout Turbo targets (the published six per block, blocks and refiner blocks): name -> (out, in)."""
    d = _dims()
    per_block = {
        "attn.to_q": (d["inner"], d["hidden"]),
        "attn.to_k": (d["inner"], d["hidden"]),
        "attn.to_v": (d["inner"], d["hidden"]),
        "attn.to_out.0": (d["hidden"], d["inner"]),
        "ff.net.0.proj": (2 * d["ffn"], d["hidden"]),
        "ff.net.2": (d["hidden"], d["ffn"]),
    }
    shapes = {}
    for i in range(TRANSFORMER_CONFIG["num_layers"]):
        shapes.update({f"transformer_blocks.{i}.{k}": v for k, v in per_block.items()})
    for i in range(TRANSFORMER_CONFIG["num_refiner_layers"]):
        shapes.update({f"token_refiner.refiner_blocks.{i}.{k}": v for k, v in per_block.items()})
    return shapes


def native_fixture_shapes() -> dict:
    """Native FlashGen targets (fused qkv_proj / fc1, adaln_proj): name -> (out, in)."""
    d = _dims()
    attn_mlp = {
        "attn.qkv_proj": (3 * d["inner"], d["hidden"]),
        "attn.out_proj": (d["hidden"], d["inner"]),
        "mlp.fc1": (2 * d["ffn"], d["hidden"]),
        "mlp.fc2": (d["hidden"], d["ffn"]),
    }
    shapes = {}
    for i in range(TRANSFORMER_CONFIG["num_layers"]):
        shapes.update({f"blocks.{i}.{k}": v for k, v in attn_mlp.items()})
        shapes[f"blocks.{i}.adaln_proj.linear"] = (18 * d["hidden"], d["temb"])
    for i in range(TRANSFORMER_CONFIG["num_refiner_layers"]):
        shapes.update({f"token_refiner.blocks.{i}.{k}": v for k, v in attn_mlp.items()})
    shapes["final_layer.adaln_proj.linear"] = (2 * d["hidden"], d["temb"])
    return shapes


def lora_tensors(shapes: dict, seed: int, *, rank: int = FIXTURE_RANK, dtype=None, std: float = 0.05,
                 prefix: str = "transformer.") -> dict:
    """``<prefix><target>.lora_{A,B}.default.weight`` pairs with random values. The published key grammars: the
    FlashGen native file prefixes ``transformer.``; the LightX2V Turbo files have no prefix
    (``transformer_blocks.N.attn.to_q.lora_A.default.weight``)."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    tensors = {}
    for name, (out_features, in_features) in shapes.items():
        down = torch.randn(rank, in_features, generator=generator) * std
        up = torch.randn(out_features, rank, generator=generator) * std
        tensors[f"{prefix}{name}.lora_A.default.weight"] = down.to(dtype or torch.float32).contiguous()
        tensors[f"{prefix}{name}.lora_B.default.weight"] = up.to(dtype or torch.float32).contiguous()
    return tensors


def native_metadata(rank: int = FIXTURE_RANK) -> dict:
    return {
        "key_format": "minimax-h3-native",
        "qkv_layout": "grouped",
        "lora_rank": str(rank),
        "lora_alpha": str(rank),  # published 64/64: pair scale 1
        "tasks": "t2va",
        "base_schedule": NATIVE_BASE_SCHEDULE,
    }


def write_minimax_fixture_loras(models_root) -> list[Path]:
    """Write the 8 published Turbo names and the FlashGen native name into ``<models_root>/loras/lorabind-tiny``."""
    import torch

    loras = fixture_lora_dir(models_root)
    loras.mkdir(parents=True, exist_ok=True)
    written = []
    for seed, (name, metadata) in enumerate(sorted(TURBO_FIXTURES.items()), start=10):
        dtype = torch.bfloat16 if "_bf16" in name else torch.float32
        tensors = lora_tensors(turbo_fixture_shapes(), seed, dtype=dtype, prefix="")
        written.append(save_fixture(loras / name, tensors, metadata))
    native = lora_tensors(native_fixture_shapes(), 99, dtype=torch.bfloat16)
    written.append(save_fixture(loras / NATIVE_FIXTURE_NAME, native, native_metadata()))
    return written


# Every file ``write_minimax_fixture_loras`` writes, relative to the loras root as a prompt names it (so a runner
# can tell when a prompt needs them).
FIXTURE_NAMES = tuple(f"{FIXTURE_LORA_FOLDER}/{name}" for name in (*sorted(TURBO_FIXTURES), NATIVE_FIXTURE_NAME))
