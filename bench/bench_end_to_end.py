"""End to end at real size (issue 47): Wan2.1-T2V-1.3B's real transformer and VAE with random weights, a rank-64
LoRA fused at strength 1, 4 steps at guidance 1 (the lightx2v 4-step contract) and a VAE decode, through the
headless runtime, side by side with diffusers' ``WanPipeline`` doing the same.

Four scenarios, each timed on both sides:
1. cold: load the pipeline, encode the prompt, fuse LoRA A at strength 1, denoise, decode;
2. strength: LoRA A at 0.5, then run (diffusers: ``unfuse_lora`` + ``fuse_lora(lora_scale=0.5)``);
3. switch: LoRA B at 0.5, then run (diffusers: ``unfuse_lora`` + ``unload_lora_weights`` + ``load_lora_weights``
   + ``fuse_lora``);
4. seed-only: the same with another seed.
Metrics: ``e2e_cold_vs_diffusers``, ``e2e_strength_vs_diffusers``, ``e2e_switch_vs_diffusers`` and
``e2e_seed_only_vs_diffusers``, each diffusers seconds / lorabind seconds. Stated, no goal (the issue asks for
them stated).

Our side is the headless runtime (``runtime.executor.PromptExecutor`` on the node pack, a workflow shaped like
``workflows/api/wan21_distill.api.json`` naming the models root): that is what ``lorabind run`` and ``lorabind
serve`` execute, including the node cache that keeps the loaded model and the encoded prompts between prompts,
so scenarios 2-4 are what a ``serve`` user's next request costs. The Python ``Generator`` asks the engine the
same use cases, without that cache, so it is not the fuller path. Our workflow also runs its negative-prompt
encode (cfg 1 does not use it) and its WebP save: both cost ours a little that diffusers (``output_type="np"``)
does not pay.

The same work on both sides: one folder loaded in bfloat16 whole (our loader's ``dtype`` input, diffusers'
``dtype=``: diffusers without one loads every model in float32, where our "auto" keeps each component as its
files store it, the VAE's float32 included); diffusers samples with flow-matching Euler on the contract's sigmas (``ContractEuler``: the folder's UniPC would be another
solver) from the same seeded noise (both draw ``torch.randn`` from a CPU generator seeded alike), so the two
outputs are compared too (``max_frame_difference``, ``max_latent_difference`` over the scenarios).

The models are written at bench time into a temp models root (nothing downloaded, nothing committed): the real
transformer (dim 1536, 12 heads, ffn 8960, text_dim 4096, 30 layers, bf16), the real Wan2.1 VAE
(``AutoencoderKLWan``'s default config, fp32) and a SMALL text encoder (UMT5 with d_model 4096 so that the
transformer's text_dim fits, 1 layer, 4 heads, d_ff 256, the bench tokenizer's vocabulary): the point is the
denoiser path (``bench_text_encoding`` measures the encoder at UMT5-XXL width). 64x64, 1 frame (16 latent tokens,
512 text positions): a full run of the case took 131-159 s on the 2-core VM under a load average of 1-3.4. Every
forward of the denoiser is timed too (``denoise_seconds``): the 4 forwards are the same work on both sides, and on
a shared machine they swing by several times, so the time outside them shows what the two paths add. One repetition per scenario
after a warm-up of the whole case at ``--quick`` size (imports, first calls); ``--quick`` alone runs the tiny
sizes in seconds (the smoke test).

The LoRAs are written by ``write_loras``: lightx2v's published Wan2.1 layout (``bench.workload.write_published_lora``:
1,428 tensors at 1.3B, norm and bias diffs and ``diff_m`` included; diffusers applies the low-rank pairs and
``diff_b`` of it and drops the norm ``.diff``s and ``diff_m``, so the two outputs differ by those too).
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import statistics
import time
from dataclasses import dataclass

import torch

from lorabind.loaders.lora import clear_lora_cache
from lorabind.loaders.models import store
from lorabind.loaders.models.store import quiet_library_progress
from lorabind.runtime import folder_paths
from lorabind.runtime.core_nodes import runtime_node_classes
from lorabind.runtime.executor import PromptExecutor
from lorabind.tiny_models.tokenizers import build_umt5_style_tokenizer
from lorabind.tiny_models.wan import tiny_vae, unipc_scheduler
from lorabind.usecases.model_folders import SETTLE_NS

from .bench_real_size import WAN21_1_3B
from .bench_text_encoding import UMT5_XXL, build_umt5
from .workload import QUICK, WorkloadSize, build_transformer, write_published_lora

WORKFLOW = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "workflows", "api",
                        "wan21_distill.api.json")
MODEL_NAME = "wan21-t2v-1.3b-random"
# "4step" in the names: the Wan file-name contract (4 steps, shift 5, cfg 1, Euler) holds on both LoRAs
LORA_A = "wan2.1_t2v_1.3b_bench_a_rank64_lightx2v_4step.safetensors"
LORA_B = "wan2.1_t2v_1.3b_bench_b_rank64_lightx2v_4step.safetensors"
PROMPT = "a cat dancing on a street, video"
STEPS, SHIFT, SEED = 4, 5.0, 42
SCENARIOS = ("cold", "strength", "switch", "seed_only")


@dataclass(frozen=True)
class Case:
    """One size of the case: the transformer, the text encoder's width and the frame size."""

    size: WorkloadSize
    real_vae: bool
    text_heads: int
    text_ff: int
    width: int
    height: int
    frames: int


FULL_CASE = Case(WAN21_1_3B, real_vae=True, text_heads=4, text_ff=256, width=64, height=64, frames=1)
QUICK_CASE = Case(QUICK, real_vae=False, text_heads=2, text_ff=32, width=32, height=32, frames=1)


def _text_encoder(vocab_size: int, case: Case):
    """UMT5-XXL's kind of layer at the transformer's text width, 1 layer, narrow heads and FFN, bf16."""
    return build_umt5(vocab_size, num_layers=1, **{**UMT5_XXL, "d_model": case.size.text_dim, "d_ff": case.text_ff,
                                                   "num_heads": case.text_heads})


def write_model(models_root: str, case: Case) -> str:
    """A diffusers Wan2.1 folder under ``models_root/diffusers``: random weights, seeded, written once."""
    from diffusers import AutoencoderKLWan, WanPipeline

    tokenizer = build_umt5_style_tokenizer()
    torch.manual_seed(0)
    vae = AutoencoderKLWan() if case.real_vae else tiny_vae()  # the default config is Wan2.1's VAE
    pipeline = WanPipeline(tokenizer=tokenizer, text_encoder=_text_encoder(len(tokenizer), case), vae=vae,
                           scheduler=unipc_scheduler(), transformer=build_transformer(case.size, seed=1))
    folder = os.path.join(models_root, "diffusers", MODEL_NAME)
    with quiet_library_progress():
        pipeline.save_pretrained(folder, safe_serialization=True)
    del pipeline
    gc.collect()
    return folder


def write_loras(loras_dir: str, size: WorkloadSize) -> tuple[str, str]:
    """LoRAs A and B, rank ``size.rank`` on every block linear: the one place to swap in another layout's writer."""
    os.makedirs(loras_dir, exist_ok=True)
    return (write_published_lora(os.path.join(loras_dir, LORA_A), size, seed=11),
            write_published_lora(os.path.join(loras_dir, LORA_B), size, seed=12))


def _contract_euler(shift: float):
    """diffusers' flow-matching Euler on the contract's sigmas: ``shifted_sigmas(steps, shift)`` (the uniform grid
    1, 1 - 1/N, ... shifted, then 0). ``WanPipeline`` asks ``set_timesteps(steps)`` only, whose default grid is
    another one, so the grid is passed here."""
    from diffusers import FlowMatchEulerDiscreteScheduler

    class ContractEuler(FlowMatchEulerDiscreteScheduler):
        def set_timesteps(self, num_inference_steps=None, device=None, **kwargs):
            grid = [1.0 - i / num_inference_steps for i in range(num_inference_steps)]
            super().set_timesteps(sigmas=grid, device=device)

    return ContractEuler(shift=shift, num_train_timesteps=1000)


class DiffusersSide:
    """``WanPipeline`` as its documentation uses it, fused LoRA (exact, like ours)."""

    def __init__(self, folder: str, case: Case):
        self.folder, self.case, self.pipe = folder, case, None

    def cold(self, lora: str) -> dict:
        from diffusers import WanPipeline

        with quiet_library_progress():  # as our loader: no "Loading pipeline components" bar
            self.pipe = WanPipeline.from_pretrained(self.folder, scheduler=_contract_euler(SHIFT),
                                                    dtype=torch.bfloat16)
        self.pipe.set_progress_bar_config(disable=True)
        self.pipe.load_lora_weights(lora, adapter_name="a")
        self.pipe.fuse_lora(lora_scale=1.0)
        return self.generate(SEED)

    def strength(self, scale: float) -> dict:
        self.pipe.unfuse_lora()
        self.pipe.fuse_lora(lora_scale=scale)
        return self.generate(SEED)

    def switch(self, lora: str, scale: float) -> dict:
        self.pipe.unfuse_lora()
        self.pipe.unload_lora_weights()
        self.pipe.load_lora_weights(lora, adapter_name="b")
        self.pipe.fuse_lora(lora_scale=scale)
        return self.generate(SEED)

    def generate(self, seed: int) -> dict:
        kept = {}

        def keep_latents(pipe, step, timestep, tensors):
            kept["latents"] = tensors["latents"]
            return {}

        with torch.no_grad():
            out = self.pipe(prompt=PROMPT, height=self.case.height, width=self.case.width,
                            num_frames=self.case.frames, num_inference_steps=STEPS, guidance_scale=1.0,
                            generator=torch.Generator("cpu").manual_seed(seed), output_type="np",
                            callback_on_step_end=keep_latents)
        return {"frames": torch.from_numpy(out.frames[0]), "latents": kept["latents"]}

    def close(self) -> None:
        self.pipe = None
        gc.collect()


@contextlib.contextmanager
def _capturing_decode(decode_node, kept: dict):
    """Keep what the VAE decode node got (the sampled latent) and returned (the frames) during a run."""
    original = getattr(decode_node, decode_node.FUNCTION)

    def decode(self, model, latent):
        result = original(self, model, latent)
        kept["latents"], kept["frames"] = latent.samples, result[0]
        return result

    setattr(decode_node, decode_node.FUNCTION, decode)
    try:
        yield
    finally:
        setattr(decode_node, decode_node.FUNCTION, original)


class OursSide:
    """The headless runtime executing the workflow; a cold run starts from empty model and LoRA caches."""

    def __init__(self, case: Case):
        self.node_classes = runtime_node_classes()[0]
        with open(WORKFLOW) as fh:
            self.prompt = json.load(fh)
        self._set("LoraBindModelLoader", model_name=MODEL_NAME, dtype="bfloat16")
        self._set("LoraBindEmptyLatent", width=case.width, height=case.height, frames=case.frames)
        self._set("LoraBindSampler", steps=STEPS, cfg=1.0, shift=SHIFT, seed=SEED)
        self._set("LoraBindTextEncode", text=PROMPT, only_first=True)
        self._set("LoraBindSaveImage", filename_prefix="lorabind-bench/end_to_end")
        self.executor = None
        self.runs = 0

    def _set(self, class_type: str, only_first: bool = False, **inputs) -> None:
        nodes = [node for node in self.prompt.values() if node["class_type"] == class_type]
        for node in nodes[:1] if only_first else nodes:
            node["inputs"].update(inputs)

    def cold(self, lora: str) -> dict:
        self.close()
        self.executor = PromptExecutor(self.node_classes)
        return self.run(lora=lora, strength=1.0, seed=SEED)

    def run(self, lora: str, strength: float, seed: int) -> dict:
        self._set("FuseDistillLoRA", lora_name=os.path.basename(lora), strength=strength)
        self._set("LoraBindSampler", seed=seed)
        kept: dict = {}
        decode_node = self.node_classes["LoraBindVAEDecode"]
        with _capturing_decode(decode_node, kept):
            self.runs += 1
            result = self.executor.execute(self.prompt, f"end-to-end-{self.runs}")
        if not result.success:
            raise RuntimeError(f"end-to-end bench workflow failed: {result.error}")
        return kept

    def close(self) -> None:
        self.executor = None
        store.clear_cache()
        clear_lora_cache()
        gc.collect()


def _difference(ours: dict, theirs: dict) -> tuple[float, float]:
    """Largest |ours - diffusers| of the frames (0..1) and of the sampled latents, after checking the shapes."""
    frames, latents = ours["frames"].float(), theirs["frames"].float()
    if frames.shape != latents.shape or ours["latents"].shape != theirs["latents"].shape:
        raise RuntimeError(f"end-to-end outputs differ in shape: frames {tuple(frames.shape)} vs "
                           f"{tuple(latents.shape)}, latents {tuple(ours['latents'].shape)} vs "
                           f"{tuple(theirs['latents'].shape)}")
    if not (torch.isfinite(frames).all() and torch.isfinite(latents).all()):
        raise RuntimeError("end-to-end outputs are not finite")
    return ((frames - latents).abs().max().item(),
            (ours["latents"].float() - theirs["latents"].float()).abs().max().item())


@contextlib.contextmanager
def _timing_denoiser(spent: list):
    """Add the wall time of every ``WanTransformer3DModel`` forward (both sides run that class) to ``spent[0]``:
    the denoise work both sides share, reported beside each scenario's total."""
    from diffusers import WanTransformer3DModel

    original = WanTransformer3DModel.forward

    def forward(self, *args, **kwargs):
        start = time.perf_counter()
        try:
            return original(self, *args, **kwargs)
        finally:
            spent[0] += time.perf_counter() - start

    WanTransformer3DModel.forward = forward
    try:
        yield
    finally:
        WanTransformer3DModel.forward = original


def _one_pass(ours: OursSide, theirs: DiffusersSide, lora_a: str, lora_b: str, times: dict, gaps: list) -> None:
    """Every scenario once on each side, alternating which side goes first; ``times[scenario][side]`` gets
    (total seconds, seconds in the denoiser's forwards)."""
    steps = {
        "cold": (lambda: ours.cold(lora_a), lambda: theirs.cold(lora_a)),
        "strength": (lambda: ours.run(lora_a, 0.5, SEED), lambda: theirs.strength(0.5)),
        "switch": (lambda: ours.run(lora_b, 0.5, SEED), lambda: theirs.switch(lora_b, 0.5)),
        "seed_only": (lambda: ours.run(lora_b, 0.5, SEED + 1), lambda: theirs.generate(SEED + 1)),
    }
    for index, (scenario, (run_ours, run_theirs)) in enumerate(steps.items()):
        order = [("lorabind", run_ours), ("diffusers", run_theirs)]
        outputs = {}
        for side, run in order if index % 2 == 0 else order[::-1]:
            spent = [0.0]
            with _timing_denoiser(spent):
                start = time.perf_counter()
                outputs[side] = run()
                times[scenario][side].append((time.perf_counter() - start, spent[0]))
        gaps.append(_difference(outputs["lorabind"], outputs["diffusers"]))


def run(workdir: str, quick: bool, reps: int = 1) -> dict:
    """The case in ``workdir/end_to_end`` (removed by the caller's temp folder); at full size, after a warm-up
    pass of the whole case at the quick size."""
    if not quick:
        _measure(os.path.join(workdir, "end_to_end_warm_up"), QUICK_CASE, 1)
    return _measure(os.path.join(workdir, "end_to_end"), QUICK_CASE if quick else FULL_CASE, reps)


def _measure(root: str, case: Case, reps: int) -> dict:
    folder = write_model(root, case)
    lora_a, lora_b = write_loras(os.path.join(root, "loras"), case.size)
    settled_at = time.monotonic() + SETTLE_NS / 1e9
    folder_paths.configure(models_root=root, output_dir=os.path.join(root, "output"))
    ours, theirs = OursSide(case), DiffusersSide(folder, case)
    times = {scenario: {"lorabind": [], "diffusers": []} for scenario in SCENARIOS}
    gaps: list = []
    time.sleep(max(0.0, settled_at - time.monotonic()))  # as bench_rerun: a user's folders were not just written
    try:
        for _ in range(reps):
            _one_pass(ours, theirs, lora_a, lora_b, times, gaps)
    finally:
        ours.close()
        theirs.close()
    seconds = {scenario: {side: statistics.median(total for total, _ in values) for side, values in sides.items()}
               for scenario, sides in times.items()}
    denoise = {scenario: {side: statistics.median(spent for _, spent in values) for side, values in sides.items()}
               for scenario, sides in times.items()}
    figures = {f"e2e_{scenario}_vs_diffusers": seconds[scenario]["diffusers"] / seconds[scenario]["lorabind"]
               for scenario in SCENARIOS}
    return {**figures, "seconds": seconds, "denoise_seconds": denoise, "max_frame_difference": max(g[0] for g in gaps),
            "max_latent_difference": max(g[1] for g in gaps),
            "label": f"{case.size.layers} blocks, dim {case.size.dim}, {case.width}x{case.height}x{case.frames}, "
                     f"{STEPS} steps, {'Wan2.1 VAE' if case.real_vae else 'tiny VAE'}"}


if __name__ == "__main__":
    import sys
    import tempfile

    # python -m bench.bench_end_to_end [--quick] [--reps N]
    reps = int(sys.argv[sys.argv.index("--reps") + 1]) if "--reps" in sys.argv else 1  # medians of N passes
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="lorabind-e2e-") as tmp:
        result = run(tmp, "--quick" in sys.argv, reps)
    print(json.dumps(result, indent=2))
    print(f"case took {time.perf_counter() - started:.1f} s")
