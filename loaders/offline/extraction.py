"""Extract a LoRA from the difference between a base and a tuned model component (``lorabind extract``).

Per parameter: a 2-D ``weight`` becomes a low-rank pair from the SVD of ``tuned - base`` (rank capped per layer
at min(out, in); √S split evenly between up and down, so neither factor dwarfs the other in low precision);
any other changed tensor (biases, norms, conv kernels, modulation tables) is stored whole as a diff, so
nothing the tuning changed is lost. Identical tensors are skipped. Every key and shape is checked before any
SVD runs, and the file is written by ``safe_output``'s rule, so a failure never leaves a partial file and an
existing file is replaced only when an earlier extract wrote it.

Output keys use diffusers module names with a prefix (default ``transformer.``, what diffusers' Wan/Qwen
pipelines write): ``<module>.lora_A.weight`` (down), ``<module>.lora_B.weight`` (up), ``<module>.alpha`` when an
alpha is written, ``<module>.diff`` / ``<module>.diff_b`` and ``<module>.<param>.diff`` for other parameters.
LightX2V's extractor options map onto ``ExtractOptions``: layer globs choosing the linears, rank (default 32,
cut per layer), alpha (default the rank), output dtype (default bf16), device, key prefix, and pairs only.
"""

from __future__ import annotations

import fnmatch
import glob
import json
import os
from dataclasses import dataclass, field
from typing import Callable, Optional

import torch

from ..errors import LoraBindError
from ..io.safe_output import output_metadata, safe_output

OUTPUT_PREFIX = "transformer."
AUTO_PREFIX = "auto"  # key prefix chosen from the tuned model's own keys (``output_prefix``)
WRITTEN_BY = "lorabind extract"


@dataclass(frozen=True)
class ExtractOptions:
    """What to extract: ``layers`` globs over module names (empty: every linear), ``rank`` cut per layer,
    ``alpha`` written per pair (None: no alpha, scale 1), ``dtype`` of the written tensors (None: the tuned
    model's per tensor), ``diffs`` (False: low-rank pairs only, like LightX2V), ``key_prefix`` and ``device``."""

    rank: int = 32
    alpha: Optional[float] = None
    dtype: Optional[torch.dtype] = None
    layers: tuple = ()
    diffs: bool = True
    key_prefix: str = OUTPUT_PREFIX
    device: str = "cpu"

    def selects(self, module: str) -> bool:
        return not self.layers or any(fnmatch.fnmatchcase(module, pattern) for pattern in self.layers)


class ExtractionError(LoraBindError):
    """Base and tuned components do not correspond (missing layer, shape mismatch) or cannot be read."""


class ComponentWeights:
    """Lazy, read-only view of a diffusers component folder's safetensors weights (one tensor at a time)."""

    def __init__(self, model_dir: str, component: str, files: Optional[list] = None):
        """``model_dir``'s ``component`` folder, or ``files`` (one merged file, a standalone folder's shards) read
        by the same names; ``model_dir/component`` is then what messages call them."""
        self.source = os.path.join(model_dir, component)  # named in messages
        files = files or sorted(glob.glob(os.path.join(self.source, "*.safetensors")))
        if not files:
            others = os.listdir(self.source) if os.path.isdir(self.source) else []
            hint = " (only pickle weights found: convert them to safetensors)" if any(
                f.endswith((".bin", ".pt", ".ckpt", ".pth")) for f in others) else ""
            raise ExtractionError(f"{self.source}: no .safetensors weights for component '{component}'{hint}")
        from safetensors import safe_open

        self._handles = {}
        self.key_file: dict[str, str] = {}
        self.shapes: dict[str, tuple] = {}
        self.dtypes: dict[str, str] = {}
        for path in files:
            handle = safe_open(path, framework="pt")
            self._handles[path] = handle
            for key in handle.keys():
                self.key_file[key] = path
                sliced = handle.get_slice(key)
                self.shapes[key] = tuple(sliced.get_shape())
                self.dtypes[key] = sliced.get_dtype()

    key_prefix = ""  # a diffusers component's keys are bare module names

    def keys(self):
        return self.key_file.keys()

    def tensor(self, key: str) -> torch.Tensor:
        return self._handles[self.key_file[key]].get_tensor(key)

    def files(self) -> list:
        return list(self._handles)


@dataclass
class ExtractionResult:
    tensors: dict = field(default_factory=dict)  # output key -> tensor
    low_rank: dict = field(default_factory=dict)  # module -> rank used
    diffs: list = field(default_factory=list)  # parameter names stored whole
    identical: int = 0  # parameters skipped because base == tuned
    max_abs_error: float = 0.0  # largest |reconstruction - diff| over the low-rank layers (truncation error)

    def summary(self) -> dict:
        ranks = sorted(set(self.low_rank.values()))
        return {"low_rank_layers": len(self.low_rank), "ranks": ranks, "diff_tensors": len(self.diffs),
                "identical_skipped": self.identical, "tensors_written": len(self.tensors),
                "max_abs_error": self.max_abs_error}


def check_correspondence(base: ComponentWeights, tuned: ComponentWeights) -> None:
    """Same keys, same shapes — or an error listing what differs (nothing is computed before this passes)."""
    missing = sorted(set(base.keys()) - set(tuned.keys()))
    extra = sorted(set(tuned.keys()) - set(base.keys()))
    if missing or extra:
        parts = []
        if missing:
            parts.append(f"missing in the tuned model ({len(missing)}): {', '.join(missing[:5])}")
        if extra:
            parts.append(f"only in the tuned model ({len(extra)}): {', '.join(extra[:5])}")
        raise ExtractionError(f"{tuned.source} does not have the layers of {base.source}: " + "; ".join(parts))
    mismatched = [k for k in sorted(base.keys()) if base.shapes[k] != tuned.shapes[k]]
    if mismatched:
        k = mismatched[0]
        raise ExtractionError(
            f"shape mismatch on '{k}': base {list(base.shapes[k])}, tuned {list(tuned.shapes[k])}"
            + (f" (and {len(mismatched) - 1} more)" if len(mismatched) > 1 else ""))


def low_rank_factors(diff: torch.Tensor, rank: int, alpha: Optional[float]) -> tuple:
    """(down, up, used rank, max abs error) with ``scale · up @ down ≈ diff``, scale = alpha/rank or 1."""
    used = max(1, min(int(rank), diff.shape[0], diff.shape[1]))
    u, s, vh = torch.linalg.svd(diff, full_matrices=False)
    root = s[:used].sqrt()
    up = u[:, :used] * root
    down = root[:, None] * vh[:used]
    error = (up @ down - diff).abs().max().item()
    if alpha is not None:  # the reader will multiply by alpha/rank: pre-divide, evenly between the factors
        correction = (used / float(alpha)) ** 0.5
        up, down = up * correction, down * correction
    return down, up, used, error


def extract_lora(base: ComponentWeights, tuned: ComponentWeights, options: ExtractOptions,
                 on_progress: Optional[Callable[[int, int], None]] = None) -> ExtractionResult:
    """The LoRA tensors turning ``base`` into ``tuned`` (see the module docstring for the key layout)."""
    if options.rank < 1:
        raise ExtractionError(f"--rank must be at least 1 (got {options.rank})")
    if options.alpha is not None and options.alpha <= 0:
        raise ExtractionError(f"--alpha must be positive (got {options.alpha})")
    check_correspondence(base, tuned)
    keys = sorted(base.keys())
    _check_layers_match(keys, options)
    result = ExtractionResult()
    prefix = output_prefix(options.key_prefix, tuned)
    for index, key in enumerate(keys):
        module, _, param = key.rpartition(".")
        is_linear = param == "weight" and len(base.shapes[key]) == 2
        wanted = options.selects(module) if is_linear else options.diffs and (not options.layers or
                                                                               options.selects(module))
        before, after = (base.tensor(key), tuned.tensor(key)) if wanted else (None, None)
        if not wanted or torch.equal(before, after):
            result.identical += 1 if wanted else 0
        elif not before.is_floating_point():
            raise ExtractionError(f"'{key}' is not a float tensor ({before.dtype}) but differs between the models")
        else:
            diff = after.to(options.device, torch.float32) - before.to(options.device, torch.float32)
            out_dtype = options.dtype or after.dtype
            if is_linear:
                down, up, used, error = low_rank_factors(diff, options.rank, options.alpha)
                result.tensors[f"{prefix}{module}.lora_A.weight"] = down.to(out_dtype).cpu().contiguous()
                result.tensors[f"{prefix}{module}.lora_B.weight"] = up.to(out_dtype).cpu().contiguous()
                if options.alpha is not None:
                    result.tensors[f"{prefix}{module}.alpha"] = torch.tensor(float(options.alpha))
                result.low_rank[module] = used
                result.max_abs_error = max(result.max_abs_error, error)
            else:
                name = {"weight": f"{module}.diff", "bias": f"{module}.diff_b"}.get(param, f"{key}.diff")
                result.tensors[f"{prefix}{name}"] = diff.to(out_dtype).cpu().contiguous()
                result.diffs.append(key)
        if on_progress is not None:
            on_progress(index + 1, len(keys))
    if not result.tensors:
        what = f" in the layers {list(options.layers)}" if options.layers else ""
        raise ExtractionError(f"{tuned.source} is identical to {base.source}{what}: there is nothing to extract")
    return result


def output_prefix(key_prefix: str, tuned) -> str:
    """The prefix written before every module name. ``auto`` (LightX2V's extractor option): the prefix the tuned
    model's own keys carry (a single file's ``model.diffusion_model.`` or ``diffusion_model.``; none for a
    diffusers folder or a file of bare keys), so the LoRA is keyed as the model it came from. A named prefix
    without its separator gets one (``diffusion_model`` -> ``diffusion_model.``): glued to the module name it
    would make keys no reader matches."""
    if key_prefix == AUTO_PREFIX:
        return getattr(tuned, "key_prefix", "")
    return key_prefix if not key_prefix or key_prefix.endswith(".") else key_prefix + "."


def _check_layers_match(keys: list, options: ExtractOptions) -> None:
    """``--layers`` globs that select no module at all are a typo, not "identical models": say so, naming
    them and a few real module names to write them against."""
    if not options.layers:
        return
    modules = sorted({key.rpartition(".")[0] for key in keys} - {""})  # "": a top-level parameter, no module
    unmatched = [glob_ for glob_ in options.layers if not any(fnmatch.fnmatchcase(m, glob_) for m in modules)]
    if len(unmatched) == len(options.layers):
        raise ExtractionError(f"--layers {unmatched} match no module of the component (its modules are named "
                              f"like {', '.join(modules[:3])}): nothing was compared")


def save_extracted(tensors: dict, out_path: str, metadata: dict, *, inputs=(), overwrite: bool = False) -> None:
    """Write the LoRA file by ``safe_output``'s rule: never over a file lorabind did not write (the base model's
    weights, say), never inside an input, and through a temporary file renamed at the end, so a failure (a full
    disk) never leaves a partial file at ``out_path``."""
    from safetensors.torch import save_file

    text_metadata = {k: v if isinstance(v, str) else json.dumps(v) for k, v in metadata.items()}
    text_metadata.update(output_metadata(WRITTEN_BY))
    with safe_output(out_path, written_by=WRITTEN_BY, kind="file", inputs=inputs, overwrite=overwrite) as staged:
        save_file(tensors, staged, metadata=text_metadata)
