"""The flag names of the guides people come from, on our commands: accepted where they mean what ours mean,
refused in one line naming ours where they do not.

Why: people copy LightX2V's ``lora_merger.py`` / ``lora_extractor.py`` commands and vllm-omni's ``serve`` lines.
``merge`` and ``extract`` take the merger's and extractor's names as extra spellings of their own options (their
``add_arguments``; ``DTYPE_SPELLINGS`` reads ``--output-dtype bfloat16``); ``serve``'s three are here. A flag we
do not reproduce is parsed and refused by name, never ``unrecognized arguments`` and never silently ignored. No
torch import here: ``lorabind --help`` stays fast.
"""

from __future__ import annotations

import argparse

from .device_options import apply_load_workers

# torch's dtype names (the guides' ``--output-dtype bfloat16``) -> ours
DTYPE_SPELLINGS = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}

_PARALLEL = "--parallel (ulysses=N, ring=N, cfg=2, tp=N; docs/serving/several-gpus.md)"
_TEMPLATE_DEFAULTS = "a template's node inputs are its defaults (edit the template's sampler)"
# vllm-omni's serve flags lorabind does not reproduce -> what it does instead, in one line. Each is parsed (with or
# without a value), so ``serve`` answers with this line and exit 2, never argparse's bare "unrecognized arguments".
VLLM_OMNI_REFUSED = {
    "--enable-cpu-offload": "lorabind's memory plans do it: --memory offload_model (components wait on the CPU "
                            "until used) or --memory auto (the cheapest plan that fits; lorabind plan shows it)",
    "--enable-layerwise-offload": "--memory offload_blocks keeps one transformer block at a time on the GPU",
    "--enable-distributed-layerwise-offload": "not reproduced; each rank of --parallel takes --memory "
                                              "offload_blocks",
    "--diffusion-offload-config": "--memory offload_model or offload_blocks, for every model loader left on auto",
    "--quantization": "lorabind quantizes no weights as it loads; serve an fp8 (scaled) or GGUF (Q8_0, Q4_K) model "
                      "file instead (docs/model-files/fp8.md, docs/gguf.md)",
    "--diffusion-quantization-config": "serve an fp8 (scaled) or GGUF model file instead (docs/model-files/fp8.md, "
                                       "docs/gguf.md)",
    "--use-hsdp": f"no FSDP sharding; --parallel tp=N splits the denoiser's weights over N ranks, see {_PARALLEL}",
    "--hsdp-shard-size": "no FSDP sharding; --parallel tp=N splits the denoiser's weights over N ranks",
    "--hsdp-replicate-size": "no FSDP sharding; --ray --replicas N serves N independent copies",
    "--cache-backend": "no step cache (TeaCache, cache-dit): every step is computed; a distill LoRA "
                       "(--lora-backend distill) cuts the step count instead",
    "--cache-config": "no step cache: every step is computed; a distill LoRA cuts the step count instead",
    "--vae-use-tiling": "the memory plan tiles the VAE decode itself when it would not fit (the sampler's report "
                        "says 'tiled VAE decode')",
    "--vae-use-slicing": "the memory plan tiles the VAE decode itself when it would not fit",
    "--vae-patch-parallel-size": f"not reproduced; {_PARALLEL} splits the denoiser, the VAE decodes on one rank",
    "--num-gpus": f"{_PARALLEL}: the ranks are the product of the degrees; --ray --replicas N for copies",
    "--usp": "spelled --ulysses-degree N (or --parallel ulysses=N) here",
    "--ulysses-mode": "not needed: ulysses without ring already splits uneven sequences and heads (diffusers' "
                      "uneven mode); with ring the degrees must divide them",
    "--text-encoder-tp-size": "not reproduced; --parallel tp=N splits the denoiser only",
    "--boundary-ratio": f"send boundary_ratio per request, or set the template sampler's boundary: {_TEMPLATE_DEFAULTS}",
    "--flow-shift": f"send flow_shift per request, or set the template sampler's shift: {_TEMPLATE_DEFAULTS}",
    "--default-sampling-params": _TEMPLATE_DEFAULTS,
    "--diffusion-attention-backend": "the template's model loader has an attention input (native, flash, sage, "
                                     "...)",
    "--max-generated-image-size": "the template's latent node bounds width and height (a request outside is a 400)",
    "--task-type": "the template decides (an image-to-video template has an image input; MiniMax-H3 takes the "
                   "request's task field)",
    "--gpu-memory-utilization": "the memory plans size themselves from the free device memory; --memory picks one",
    "--served-model-name": "--openai-model NAME=WORKFLOW.api.json names each served model",
    "--model": "the served model is a workflow: --openai-model NAME=WORKFLOW.api.json (its loader names the model "
               "under --models)",
    "--host": "--listen IP (ComfyUI's name of it)",
}
# vllm-omni's serve flags whose meaning is lorabind's default: taken, and said once at start
VLLM_OMNI_NOTED = {
    "--omni": "nothing to switch on: lorabind serve always serves diffusion workflows",
    "--enforce-eager": "lorabind runs eagerly already (torch.compile only where a model loader's compile input is on)",
}


# LightX2V's lora_merger.py / lora_extractor.py format flags -> what each names (their values: safetensors or pytorch)
FORMAT_FLAGS = {"--source-type": "the base model", "--target-type": "the tuned model", "--lora-type": "the LoRA",
                "--output-format": "the output"}
FORMATS = ("safetensors", "pytorch")


def add_format_arguments(parser, flags) -> None:
    """LightX2V's format flags (``flags``: which of ``FORMAT_FLAGS`` the command's guide tool has). safetensors is
    what lorabind reads and writes anyway; pytorch is refused by ``format_refusal``."""
    for flag in flags:
        parser.add_argument(flag, dest=_format_dest(flag), choices=FORMATS, default=None,
                            help=f"LightX2V's format of {FORMAT_FLAGS[flag]}: safetensors (the only one lorabind "
                                 "reads and writes; pytorch pickle files are refused)")


def _format_dest(flag: str) -> str:
    return "format_" + flag.lstrip("-").replace("-", "_")


def format_refusal(args) -> str | None:
    """Why a ``pytorch`` format flag is refused (the pickle message), or None."""
    for flag, what in FORMAT_FLAGS.items():
        if getattr(args, _format_dest(flag), None) != "pytorch":
            continue
        verb = "writes" if flag == "--output-format" else "reads"
        return (f"{flag} pytorch: lorabind {verb} safetensors only; pickle checkpoints (.pt, .pth) are refused because "
                f"loading them can run arbitrary code. Convert {what} to .safetensors first")
    return None


def dtype_name(value: str) -> str:
    """``--dtype`` / ``--output-dtype`` value in our spelling (``bfloat16`` -> ``bf16``); argparse's choices
    then check it."""
    return DTYPE_SPELLINGS.get(value, value)


def add_serve_guide_arguments(parser) -> None:
    """vllm-omni's serve flags."""
    parser.add_argument("--lora-scale", type=float, default=None, metavar="S",
                        help="vllm-omni's scale of the --lora-path files: only 1 is taken (distill files are fused "
                             "at the strength their contract is trained for; a request sets its adapter's scale "
                             "with lora.scale)")
    # vllm-omni's --num-weight-load-threads N is an alias of --load-workers N (device_options, on run and serve)
    parser.add_argument("--disable-multithread-weight-load", action="store_true",
                        help="load weight files one at a time (the same as --load-workers 1)")
    for flag in (*VLLM_OMNI_REFUSED, *VLLM_OMNI_NOTED):  # answered by apply_serve_guide_arguments, not listed
        parser.add_argument(flag, dest=_dest(flag), nargs="?", const=True, default=None, help=argparse.SUPPRESS)


def _dest(flag: str) -> str:
    return "vllm_omni_" + flag.lstrip("-").replace("-", "_")


def serve_guide_notes(args) -> list[str]:
    """One line for each vllm-omni flag given whose meaning is lorabind's default."""
    return [f"{flag}: {note}" for flag, note in VLLM_OMNI_NOTED.items() if getattr(args, _dest(flag)) is not None]


def apply_serve_guide_arguments(args) -> str | None:
    """Apply (or refuse, in one line naming ours) the guide flags ``serve`` was given; an error text or None."""
    refused = next((flag for flag in VLLM_OMNI_REFUSED if getattr(args, _dest(flag)) is not None), None)
    if refused is not None:
        return f"{refused}: vllm-omni's flag; {VLLM_OMNI_REFUSED[refused]}"
    if args.lora_scale is not None and args.lora_scale != 1.0:
        if args.lora_backend == "peft":
            return (f"--lora-scale {args.lora_scale:g}: with --lora-backend peft the --lora-path files are adapters "
                    "loaded for requests to use, each at the scale its request's lora.scale gives")
        return (f"--lora-scale {args.lora_scale:g}: not supported; --lora-path distill files are fused at strength "
                "1 (what their contract is trained for), and a request sets its adapter's scale with lora.scale")
    if args.disable_multithread_weight_load:
        if args.load_workers not in (None, 1):
            return (f"--disable-multithread-weight-load and --load-workers (--num-weight-load-threads) "
                    f"{args.load_workers} contradict each other")
        return apply_load_workers(1)
    return None
