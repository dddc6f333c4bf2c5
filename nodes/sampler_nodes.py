"""LoraBindSampler: resolve the sampling contract, bind the model's LoRA state, denoise."""

from __future__ import annotations

import torch

from ..usecases.verbs import plan_sampling, sample
from ..usecases.vocabulary import (
    END_OF_SCHEDULE,
    MAX_STEPS,
    SCHEDULER_CHOICES,
    SOCKET_ADAPTER,
    SOCKET_CONDITIONING,
    SOCKET_LATENT,
    SOCKET_MODEL,
    SOCKET_SCHEDULE,
    SOCKET_SIGMAS,
    SampleOptions,
)
from .comfy_bridge import ProgressBar, WorkProgress, check_interrupted, step_preview


def _report_lines(report: dict, schedule_lines: tuple) -> list[str]:
    """The sampler's text output (``lorabind run`` prints it): schedule, contracts, expert switch, what bound.
    ``schedule_lines``: ``_schedule_lines`` of the run's plan (a node keeps them with the plan)."""
    first, rest = schedule_lines
    # list comprehensions, not generators: a generator costs a Python call per item, and this runs after the denoise
    lines = [first, *[f"warning: {w}" for w in report.get("warnings", ())], *rest]
    bound = report["bind"]
    lines.append(f"bind: {len(bound['fuses'])} LoRA(s) fused, {len(bound['adapters'])} adapter(s) active; "
                 f"{bound['written']} model parameters written, {bound['restored']} restored to base")
    lines += [f"bind: {fuse['name']} fused into {fuse['component']} at strength {fuse['strength']:g} "
              f"({fuse['accounting']['counts']['applied']} file tensors, {fuse['accounting'].get('parameters', 0)} "
              f"model parameters)" for fuse in bound["fuses"]]
    lines += [f"warning: {w}" for w in bound["warnings"]]
    placed = report.get("placement")
    if placed:
        where = ", ".join([f"{name}: {at}" for name, at in placed["components"].items()])
        lines.append(f"memory={placed['memory']} on {placed['device']}"
                     f"{' (tiled VAE decode)' if placed['vae_tiling'] else ''}; {where}; "
                     f"{placed['swaps']} expert swaps, {placed['upload_seconds']:g} s uploading")
    if report.get("batching"):  # served with --max-batch above 1
        lines.append(_batching_line(report["batching"]))
    lines += [f"tensor parallel: {split['component']} holds {split['bytes_per_rank'] / 2**20:.2f} MiB of the "
              f"{split['bytes_whole'] / 2**20:.2f} MiB of its {split['split_parameters']} split parameters on each "
              f"rank" for split in report.get("tensor_parallel", ())]
    return lines


def _batching_line(batching: dict) -> str:
    """How the run shared the step engine's forwards with other prompts."""
    parts = [f"batched: {batching['forwards']} forwards, in batches of up to {batching['largest_batch']}"]
    if batching["row_applied"]:
        parts.append(f"on its own rows: {', '.join(batching['row_applied'])}")
    if batching["fused_for_batch"]:
        parts.append(f"fused for its whole batch: {', '.join(batching['fused_for_batch'])}")
    if batching["alone"]:
        parts.append(f"alone: {batching['alone']}")
    return "; ".join(parts)


def _schedule_lines(report: dict, enforced: bool) -> tuple[str, list[str]]:
    """(the schedule line, the stage/contract/expert lines that follow the run's warnings): what the plan alone
    decides, so a seed-only rerun does not format them again."""
    first = (f"steps={report['steps']} shift={report['shift']:g} cfg={report['cfg']} "
             f"sigmas=[{', '.join(f'{s:.4f}' for s in report['sigmas'])}]")
    lines = []
    if report.get("start_step", 0) or report.get("end_step", report["steps"]) != report["steps"]:
        lines.append(f"stage: steps {report['start_step']}..{report['end_step'] - 1} of {report['steps']} "
                     f"(add_noise {'on' if report['add_noise'] else 'off'})")
    if report.get("scheduler", "euler") != "euler":
        lines.append(f"scheduler: {report['scheduler']}")
    lines += [f"contract{' enforced' if enforced else ''}: {c['text']}" for c in report["contracts"]]
    if report["boundary"] is not None:
        lines.append(f"boundary={report['boundary']:g} experts: {' '.join(report['experts'])}")
        lines += _expert_switch_lines(report)
    lines += [f"contract override: {text}" for text in report["overrides"]]
    lines += [f"schedule: {text}" for text in report.get("notes", ())]
    return first, lines


def _expert_switch_lines(report: dict) -> list[str]:
    """Where a two-expert model hands over, e.g. ``expert switch at step 2 (σ=0.8333 < boundary 0.875):
    transformer -> transformer_2``; steps count from 0, step i runs from sigma i to sigma i+1."""
    experts, sigmas = report["experts"], report["sigmas"]
    return [f"expert switch at step {step} (σ={sigmas[step]:.4f} < boundary {report['boundary']:g}): "
            f"{experts[step - 1]} -> {experts[step]}"
            for step in range(1, len(experts)) if experts[step] != experts[step - 1]]


def _bind_label(model) -> str:
    """What the bind's work is called while it runs: without fuses it can only restore layers to base weights."""
    return "binding LoRA layers" if model.fuses else "restoring base weights"


# The staged-sampling inputs (optional, appended after the older ones so saved workflows keep their values).
STAGE_INPUTS = {
    "sigmas": (SOCKET_SIGMAS, {"tooltip": "ComfyUI SIGMAS (BasicScheduler, SplitSigmas, LoraBind Sigmas, a sampler's "
                                          "sigmas output): the schedule to run instead of steps + shift. Under a "
                                          "contract it must be a contiguous part of the contract's table."}),
    "scheduler": (list(SCHEDULER_CHOICES), {"default": "euler", "tooltip": (
        "Step rule over the sigmas: euler (ours), unipc / dpmpp_2m (diffusers' flow-matching schedulers), or "
        "default: what a contract pins (distill LoRAs: euler), else the family's reference (Wan: unipc).")}),
    "start_step": ("INT", {"default": 0, "min": 0, "max": END_OF_SCHEDULE, "tooltip": (
        "First step of the schedule this sampler runs (a stage; KSamplerAdvanced's start_at_step).")}),
    "end_step": ("INT", {"default": END_OF_SCHEDULE, "min": 1, "max": END_OF_SCHEDULE, "tooltip": (
        "Step where this sampler stops (exclusive; 10000 = the end). Stopping early leaves a noisy latent for the "
        "next sampler.")}),
    "denoise": ("FLOAT", {"default": 1.0, "min": 0.01, "max": 1.0, "step": 0.01, "tooltip": (
        "Below 1: run the last 'steps' steps of a schedule of steps/denoise steps from the input latent "
        "(img2img, refinement), as ComfyUI's KSampler.")}),
    "add_noise": ("BOOLEAN", {"default": True, "tooltip": (
        "Noise the latent to the stage's first sigma; off continues a latent an earlier stage left noisy.")}),
}


class LoraBindSampler:
    DESCRIPTION = (
        "Flow-matching Euler sampler over an explicit sigma schedule. Before touching any weight it checks the "
        "request against every sampling contract in the graph (distill LoRAs, Turbo/native adapters, pinned "
        "checkpoints) and refuses a mismatch; then it binds exactly this branch's LoRAs to the shared model and "
        "denoises. Wan2.2 switches from the high-noise to the low-noise expert at the boundary (each expert with "
        "its own guidance when cfg_low_noise is set). The sigmas that ran are also output as ComfyUI SIGMAS."
    )
    CATEGORY = "lorabind/sampling"
    RETURN_TYPES = (SOCKET_LATENT, SOCKET_SIGMAS)
    RETURN_NAMES = ("latent", "sigmas")
    OUTPUT_TOOLTIPS = (
        "The denoised latent (decode it with LoraBind VAE Decode); after a stage that stopped early, its noise "
        "state for the next sampler (add_noise off, start_step where this one stopped).",
        "The sigmas this sampler actually ran (contract-resolved; a stage's slice of the schedule), as ComfyUI "
        "SIGMAS: a 1-D float tensor of steps + 1 points, usable by ComfyUI's custom-sampling nodes.",
    )
    FUNCTION = "sample"

    @classmethod
    def INPUT_TYPES(cls):
        return {
            "required": {
                "model": (SOCKET_MODEL, {"tooltip": "The model with the LoRAs of this branch."}),
                "positive": (SOCKET_CONDITIONING, {"tooltip": "What to generate."}),
                "negative": (SOCKET_CONDITIONING, {"tooltip": "What to avoid (unused when cfg is 1)."}),
                "latent": (SOCKET_LATENT, {"tooltip": "The start latent (an empty latent for text-to-video)."}),
                "seed": ("INT", {"default": 0, "min": 0, "max": 0xFFFF_FFFF_FFFF_FFFF, "control_after_generate": True,
                                 "tooltip": "Noise seed; noise is drawn on the CPU so every device gets the same."}),
                "steps": ("INT", {"default": 4, "min": 0, "max": MAX_STEPS,
                                  "tooltip": "Denoiser evaluations (a schedule has steps + 1 sigma points); 0 = the "
                                             "step count the connected contract declares (refused without one)."}),
                # 4 steps at cfg 1 (and shift 5): a distill contract's pair (issue 57: cfg 5 with 4 steps was none)
                "cfg": ("FLOAT", {"default": 1.0, "min": 0.0, "max": 100.0, "step": 0.1, "round": 0.01,
                                  "tooltip": "Classifier-free guidance; 1.0 skips the negative pass (distilled)."}),
                "shift": ("FLOAT", {"default": 5.0, "min": 0.0, "max": 100.0, "step": 0.1,
                                    "tooltip": "Flow-matching time shift of the sigma schedule."}),
                "boundary": ("FLOAT", {"default": 0.0, "min": 0.0, "max": 1.0, "step": 0.005,
                                       "tooltip": "Wan2.2 MoE: sigma at which the low-noise expert takes over; "
                                                  "0 uses the model's own boundary_ratio."}),
                "enforce_contract": ("BOOLEAN", {"default": True,
                                                 "tooltip": "Refuse requests that break an artifact's sampling "
                                                            "contract; off runs them anyway and reports the "
                                                            "override."}),
            },
            "optional": {
                "adapter": (SOCKET_ADAPTER, {"tooltip": "Dynamic adapters (PEFT) active for this run only."}),
                "schedule": (SOCKET_SCHEDULE, {"tooltip": "A schedule contract (e.g. from MiniMax Turbo Schedule)."}),
                "cfg_low_noise": ("FLOAT", {"default": 0.0, "min": 0.0, "max": 100.0, "step": 0.1, "round": 0.01,
                                            "tooltip": "Wan2.2 MoE: guidance of the low-noise expert "
                                                       "(transformer_2), like diffusers' guidance_scale_2; 0 uses "
                                                       "cfg for both experts. Contracts check both values."}),
                "audio_flow_shift": ("FLOAT", {"default": 0.0, "min": 0.0, "max": 100.0, "step": 0.1,
                                               "tooltip": "MiniMax-H3: time shift of the audio schedule; 0 takes "
                                                          "it from the contract or checkpoint (Turbo: 3)."}),
                **STAGE_INPUTS,
            },
        }

    def sample(self, model, positive, negative, latent, seed, steps, cfg, shift, boundary, enforce_contract,
               adapter=None, schedule=None, cfg_low_noise=0.0, audio_flow_shift=0.0, sigmas=None,
               scheduler="euler", start_step=0, end_step=END_OF_SCHEDULE, denoise=1.0, add_noise=True):
        options = SampleOptions(seed=seed, steps=steps, cfg=cfg, shift=shift, boundary=boundary,
                                enforce_contract=enforce_contract, cfg_low_noise=cfg_low_noise,
                                audio_flow_shift=audio_flow_shift, scheduler=scheduler,
                                sigmas=None if sigmas is None else tuple(float(s) for s in sigmas),
                                start_step=start_step, end_step=end_step, denoise=denoise,
                                add_noise=add_noise)
        bars: list = []  # the step bar starts with the first step, after binding
        preview, previews = step_preview(model, latent), []  # None: no preview method, nothing computed

        def keep_preview(done: int, total: int, denoised) -> None:
            previews[:] = [preview(done, total, denoised)]

        def report_step(done: int, total: int) -> None:
            if not bars:
                bars.append(ProgressBar(total))
            bars[0].update_absolute(done, total=total, preview=previews.pop() if previews else None)

        # Binding (fusing / restoring LoRA layers: minutes on a 14B expert) is reported as work, not as steps:
        # clients read every step-progress message as a sampling step.
        # A node instance persists per node id (here and in ComfyUI): its last plan serves a seed-only rerun.
        plan = self._plan = plan_sampling(model, positive, negative, latent, options, adapter=adapter,
                                          schedule=schedule, reuse=getattr(self, "_plan", None))
        samples, resolved, report = sample(
            model, positive, negative, latent, options, adapter=adapter, schedule=schedule, on_step=report_step,
            on_bind=WorkProgress(_bind_label(model)).update, check_interrupt=check_interrupted, plan=plan,
            on_latent=keep_preview if preview is not None else None)
        text = _report_lines(report, self._lines_of(plan, report, enforce_contract))
        return {"ui": {"lorabind_schedule": [report], "text": text},
                "result": (samples, self._sigmas_output(resolved.stage_sigmas()))}

    def _lines_of(self, plan, report: dict, enforced: bool) -> tuple:
        """The schedule lines of ``plan`` (``enforced`` is one of its options), formatted once per plan."""
        kept = getattr(self, "_plan_lines", None)
        if kept is None or kept[0] is not plan:
            kept = self._plan_lines = (plan, _schedule_lines(report, enforced))
        return kept[1]

    def _sigmas_output(self, sigmas) -> torch.Tensor:
        """The SIGMAS output: the same tensor as last run while the stage ran the same sigmas (node instances
        persist per node id). A seed-only rerun rebuilt it for nothing, tens of µs when the sampler has left
        torch's code cold; downstream nodes treat it as read-only, as they do every cached output."""
        points = tuple(map(float, sigmas))
        last = getattr(self, "_last_sigmas", None)
        if last is None or last[0] != points:
            last = self._last_sigmas = (points, torch.tensor(points, dtype=torch.float32))
        return last[1]


NODE_CLASS_MAPPINGS = {"LoraBindSampler": LoraBindSampler}
NODE_DISPLAY_NAME_MAPPINGS = {"LoraBindSampler": "Sampler (lorabind)"}
