"""The files and workflows of ``bench_comfyui``: a ComfyUI-detectable Wan2.2 pair at the bench's width, two LoRA
pairs for it, and one API workflow per path and stage.

ComfyUI reads the denoiser's width, FFN width and block count from the file but fixes heads (width / 128) and the
text-embedding width (4096), so the bench width (1536, 12 heads, 4096 text) loads there as is. Our own path also
loads a diffusers folder of the same two experts, with a tiny Wan VAE and a one-layer UMT5 that is 4096 wide
(so its output fits the denoiser), both cheap next to the denoisers. Everything is random and written at bench time into a temp dir.
"""

from __future__ import annotations

from pathlib import Path

from .workload import FULL, WorkloadSize, build_transformer, write_lora

# ComfyUI's Wan: heads = width / 128, text embedding 4096 wide; the smoke size keeps both.
QUICK_COMFY = WorkloadSize(dim=128, heads=1, ffn=256, text_dim=4096, layers=2, rank=8)
SIZES = {"full": FULL, "quick": QUICK_COMFY}
FOLDER = "lorabind-bench"
DENOISERS = {"high": f"{FOLDER}/wan2.2_t2v_high_noise_bench_bf16.safetensors",
             "low": f"{FOLDER}/wan2.2_t2v_low_noise_bench_bf16.safetensors"}
# two pairs: the swap stage moves from pair a to pair b
LORAS = {pair: {expert: f"{FOLDER}/bench_{pair}_{expert}_noise_rank.safetensors" for expert in ("high", "low")}
         for pair in ("a", "b")}
FOLDER_MODEL = "lorabind-bench-wan22-t2v"  # our path's diffusers folder: the same experts' weights
PATHS = ("comfyui", "lorabind_pair", "lorabind_model")
PATH_LABELS = {"comfyui": "ComfyUI `LoraLoaderModelOnly` x2", "lorabind_pair": "our `LoraBindLoRAPair` on its MODEL",
               "lorabind_model": "our model path (our loader + sampler)"}
# stage -> (LoRA pair, high strength, low strength); each stage changes one thing from the one before
STAGES = {"first": ("a", 1.0, 1.0), "strength": ("a", 0.5, 1.0), "swap": ("b", 0.5, 1.0)}
STAGE_LABELS = {"first": "first run", "strength": "re-run, one strength changed", "swap": "re-run, other pair"}
PROMPTS = ("a red fox running through fresh snow", "blurry, static")
STEPS, SWITCH_STEP, SHIFT, BOUNDARY = 4, 2, 5.0, 0.875
LATENT = {"width": 32, "height": 32, "frames": 5}  # 8 tokens: the step is cheap, loading and patching dominate


def write_models(models_root, size: WorkloadSize) -> None:
    """Both experts as ComfyUI files (diffusion_models/) and, with the same weights, as our diffusers folder
    (diffusers/, with the tiny VAE and the 4096-wide UMT5); both LoRA pairs (loras/) under ``models_root``.

    Why a folder for our path: our single-file loader recognises a file by its configuration (layer count
    included), and a 4-block Wan is no published one; a diffusers folder carries its config."""
    import diffusers
    from safetensors.torch import save_file

    from lorabind.loaders.families.wan import key_layouts as layouts
    from lorabind.loaders.models.single_file.native_files import native_tensors
    from lorabind.tiny_models._common import save_pipeline_atomically

    root = Path(models_root)
    keep = diffusers.WanTransformer3DModel._keep_in_fp32_modules
    experts = []
    for seed, name in enumerate(DENOISERS.values()):
        experts.append(build_transformer(size, seed=seed))
        path = root / "diffusion_models" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        tensors = native_tensors(experts[-1].state_dict(), layouts.WAN_TRANSFORMER, keep_fp32_modules=keep)
        save_file({k: v.contiguous() for k, v in tensors.items()}, str(path))
        del tensors
    save_pipeline_atomically(_our_pipeline(*experts), root / "diffusers" / FOLDER_MODEL)
    for seed, name in enumerate((n for pair in LORAS.values() for n in pair.values()), start=1):
        (root / "loras" / name).parent.mkdir(parents=True, exist_ok=True)
        write_lora(str(root / "loras" / name), size, seed=seed)


def _our_pipeline(high, low):
    """A Wan2.2 pipeline of the two experts, the tiny models' tokenizer and VAE, and a one-layer UMT5 as wide as
    the experts' text input (4096)."""
    from diffusers import WanPipeline
    from transformers import UMT5Config, UMT5EncoderModel

    from lorabind.tiny_models._common import seeded
    from lorabind.tiny_models.tokenizers import build_umt5_style_tokenizer
    from lorabind.tiny_models.wan import WAN22_BOUNDARY_RATIO, tiny_vae, unipc_scheduler

    tokenizer = build_umt5_style_tokenizer()
    config = UMT5Config(vocab_size=len(tokenizer), d_model=high.config.text_dim, d_kv=8, d_ff=64, num_layers=1,
                        num_heads=4, relative_attention_num_buckets=8, relative_attention_max_distance=16,
                        feed_forward_proj="gated-gelu", dropout_rate=0.0)
    with seeded(0):
        text_encoder = UMT5EncoderModel(config).eval().to(high.dtype)
        vae = tiny_vae()
    return WanPipeline(tokenizer=tokenizer, text_encoder=text_encoder, vae=vae, scheduler=unipc_scheduler(),
                       transformer=high, transformer_2=low, boundary_ratio=WAN22_BOUNDARY_RATIO)


def workflow(path: str, stage: str) -> dict:
    """The API-format workflow of ``path`` at ``stage``."""
    pair, strength_high, strength_low = STAGES[stage]
    loras = LORAS[pair]
    if path == "lorabind_model":
        return _our_model_path(loras, strength_high, strength_low)
    graph = {
        "1": _node("UNETLoader", unet_name=DENOISERS["high"], weight_dtype="default"),
        "2": _node("UNETLoader", unet_name=DENOISERS["low"], weight_dtype="default"),
        "3": _node("LoraBindTestWanConditioning", text=PROMPTS[0]),
        "4": _node("LoraBindTestWanConditioning", text=PROMPTS[1]),
        "7": _node("EmptyHunyuanLatentVideo", width=LATENT["width"], height=LATENT["height"],
                   length=LATENT["frames"], batch_size=1),
        "10": _node("SaveLatent", samples=["9", 0], filename_prefix="lorabind_bench/latent"),
    }
    if path == "comfyui":
        graph["5"] = _node("LoraLoaderModelOnly", model=["1", 0], lora_name=loras["high"], strength_model=strength_high)
        graph["6"] = _node("LoraLoaderModelOnly", model=["2", 0], lora_name=loras["low"], strength_model=strength_low)
        high, low = ["5", 0], ["6", 0]
    else:
        graph["5"] = _node("LoraBindLoRAPair", model_high=["1", 0], model_low=["2", 0], lora_high=loras["high"],
                           lora_low=loras["low"], strength_high=strength_high, strength_low=strength_low,
                           boundary=BOUNDARY, lenient=False, enforce_contract=True)
        high, low = ["5", 0], ["5", 1]
    graph["11"] = _node("ModelSamplingSD3", model=high, shift=SHIFT)
    graph["12"] = _node("ModelSamplingSD3", model=low, shift=SHIFT)
    common = {"noise_seed": 42, "steps": STEPS, "cfg": 1.0, "sampler_name": "euler", "scheduler": "simple",
              "positive": ["3", 0], "negative": ["4", 0]}
    graph["8"] = _node("KSamplerAdvanced", model=["11", 0], add_noise="enable", latent_image=["7", 0], start_at_step=0,
                       end_at_step=SWITCH_STEP, return_with_leftover_noise="enable", **common)
    graph["9"] = _node("KSamplerAdvanced", model=["12", 0], add_noise="disable", latent_image=["8", 0],
                       start_at_step=SWITCH_STEP, end_at_step=10000, return_with_leftover_noise="disable", **common)
    return graph


def _our_model_path(loras: dict, strength_high: float, strength_low: float) -> dict:
    return {
        "1": _node("LoraBindModelLoader", model_name=FOLDER_MODEL, dtype="auto", device="auto", memory="auto",
                   attention="native", compile=False, max_cached_adapters=0),
        "2": _node("LoraBindTextEncode", model=["1", 0], text=PROMPTS[0]),
        "3": _node("LoraBindTextEncode", model=["1", 0], text=PROMPTS[1]),
        "4": _node("LoraBindEmptyLatent", model=["1", 0], batch_size=1, **LATENT),
        "5": _node("WanMoELoRAPair", model=["1", 0], high_noise_lora=loras["high"], high_noise_strength=strength_high,
                   low_noise_lora=loras["low"], low_noise_strength=strength_low, lenient=False, strength_schedule=""),
        "6": _node("LoraBindSampler", model=["5", 0], positive=["2", 0], negative=["3", 0], latent=["4", 0], seed=42,
                   steps=STEPS, cfg=1.0, shift=SHIFT, boundary=BOUNDARY, enforce_contract=True, cfg_low_noise=0.0,
                   audio_flow_shift=0.0, scheduler="euler", start_step=0, end_step=10000, denoise=1.0,
                   add_noise=True),
        "7": _node("LoraBindVAEDecode", model=["1", 0], latent=["6", 0]),
        "8": _node("LoraBindSaveImage", images=["7", 0], filename_prefix="lorabind_bench/ours", fps=8.0),
    }


def _node(class_type: str, **inputs) -> dict:
    return {"class_type": class_type, "inputs": inputs}
