"""`lorabind inspect FILE_OR_DIR [--model DIFFUSERS_DIR] [--json]`: what a LoRA file or PEFT folder is (or, given a
single model file, the contracts ``lorabind merge`` baked into it; given a GGUF denoiser, as FILE or as
``--model X.gguf``, its tensors, quantization types and family, from the header only).

Reports the detected layout and model family, rank/alpha/scale, tensor counts by part, each adapter kind with its
modules, tensors, ranks and alphas, the file's metadata, the
sampling contract its name/metadata declares, and with ``--model`` the key accounting against that model (the
same check the fuse nodes run). A file the engine would refuse (pickle format, broken header, keys that do not
fit, a refused contract) exits 1 with the reason, which names the file; keys that match nothing in ``--model``
are listed in the report's accounting (so the user sees which) and also exit 1, as the engine would refuse
them. Module-level imports stay light: the CLI's ``--help`` must not import torch.
"""

from __future__ import annotations

import json
import os
import sys

EXIT_REFUSED = 1
_SHOWN_UNMATCHED = 10  # the text report lists this many unmatched keys; --json lists them all
_SHOWN_TENSORS = 40  # the text report of a GGUF file lists this many tensors; --json lists them all


def add_arguments(parser) -> None:
    parser.add_argument("path", metavar="FILE_OR_DIR", nargs="?",
                        help="a .safetensors LoRA file or a PEFT adapter folder (or a single model file)")
    parser.add_argument("--model", metavar="DIFFUSERS_DIR",
                        help="diffusers model folder to account the keys against (applied / expected-unmatched / "
                             "unmatched); alone, a .gguf denoiser to report on")
    parser.add_argument("--lenient", action="store_true",
                        help="with --model: keys that match nothing are listed but do not fail the command (as "
                             "the nodes' lenient input and merge --lenient skip them)")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of text")


def run(args) -> int:
    # lazy: the CLI's parser imports every command module; the engine loads when it runs
    from ...loaders.errors import LoraBindError
    from ...loaders.models.single_file.detect import detect_model_file

    if args.path is None and str(args.model or "").lower().endswith(".gguf"):
        args.path, args.model = args.model, None  # `inspect --model X.gguf`: the model file itself
    if args.path is None:
        print("lorabind inspect: give a LoRA file or folder (or --model X.gguf)", file=sys.stderr)
        return 2
    try:
        model_file = detect_model_file(args.path, os.path.basename(args.path))
        if model_file is not None and args.model:
            raise LoraBindError(f"{model_file.name} is a model file ({model_file.describe()}); --model accounts a "
                                "LoRA's keys against a model")
        report = inspect_model_file(args.path) if model_file else inspect_lora(args.path, model_dir=args.model)
    except LoraBindError as exc:
        print(f"lorabind inspect: refused: {exc}", file=sys.stderr)
        return EXIT_REFUSED
    text = format_model_report(report) if model_file else format_report(report)
    print(json.dumps(report, indent=2) if args.json else text)
    refusal = (report.get("accounting") or {}).get("refusal")
    if refusal and not args.lenient:  # unmatched keys: listed above, and refused as the fuse nodes and merge would
        print(f"lorabind inspect: refused: {refusal}", file=sys.stderr)
        return EXIT_REFUSED
    return 0


def inspect_model_file(path: str) -> dict:
    """A single model file's report: what it is and the contracts ``lorabind merge`` baked into it (the
    declaration the contract endpoint answers for ``diffusion_models``, which the loader enforces), with what
    was fused."""
    # lazy: the CLI's parser imports every command module; the engine loads when it runs
    from ...loaders.dispatch.contract_discovery import model_file_contract
    from ...loaders.io.gguf_header import header_summary, is_gguf_path, read_gguf_header
    from ...loaders.models.single_file.baked_files import baked_file_record
    from ...loaders.models.single_file.detect import detect

    name = os.path.basename(path)
    declaration = model_file_contract(path, name)
    report = {**declaration, "path": os.path.abspath(path), "format": "single model file",
              "model": detect(path, name).describe(), "fused": baked_file_record(path).get("fused") or []}
    if is_gguf_path(path):
        report.update(format="GGUF model file", gguf=header_summary(read_gguf_header(path, name)))
    return report


def format_model_report(report: dict) -> str:
    lines = [report["file"], f"  format:   {report['format']} ({report['model']})",
             f"  family:   {report['family']}"]
    lines += [f"  fused:    {entry.get('name')} at strength {entry.get('strength')} into {entry.get('component')}"
              for entry in report["fused"]]
    contracts = report["contracts"]
    lines += [f"  contract: {c.get('text') or json.dumps(c)}" for c in contracts]
    if not contracts:
        lines.append(f"  contract: none ({report['reason']})")
    if "gguf" in report:
        lines += _gguf_lines(report["gguf"])
    return "\n".join(lines)


def _gguf_lines(gguf: dict) -> list:
    """The GGUF header in a few lines, then its tensors (``_SHOWN_TENSORS``; ``--json`` lists them all)."""
    types = ", ".join(f"{name} x{count}" for name, count in gguf["types"].items())
    lines = [f"  gguf:     version {gguf['gguf_version']}, architecture {gguf['architecture'] or '(none)'}, "
             f"{gguf['tensor_count']} tensors: {types}",
             f"  bytes:    {gguf['bytes']} ({gguf['quantized_bytes']} quantized)"]
    shown = gguf["tensors"][:_SHOWN_TENSORS]
    lines += [f"  tensor:   {t['name']} {t['type']} {t['shape']}" for t in shown]
    if len(gguf["tensors"]) > len(shown):
        lines.append(f"  ... {len(gguf['tensors']) - len(shown)} more tensors (--json lists them all)")
    return lines


def inspect_lora(path: str, *, model_dir: str | None = None) -> dict:
    """The report as a JSON-able dict (the ``--json`` output). Raises LoraBindError for a refused file."""
    # lazy: the CLI's parser imports every command module; the engine loads when it runs
    from ...loaders import families
    from ...loaders.dispatch.contract_discovery import contract_to_dict, discover_contract
    from ...loaders.lora import read_lora
    from ...loaders.lora.preparation import kind_summary

    lora = read_lora(path)
    family_module = families.guess_family(lora)
    model = None
    if model_dir:  # structure only (meta device): accounting compares names and shapes, no weight is read
        # lazy: the CLI's parser imports every command module; the engine loads when it runs
        from ...loaders.models.structure import load_structure

        model = load_structure(model_dir)
        family_module = family_module or families.for_model_family(model.family)
    # rank/alpha/scale as the engine applies them: after the family's rewrites (e.g. the MiniMax-H3 Turbo
    # alpha-8 default for files that declare none)
    prepared = family_module.keymap.prepare(lora, family_module.model_families[0]) if family_module else lora
    lows = [patch.low_rank for patch in prepared.targets.values() if patch.low_rank is not None]
    contract = discover_contract(path, family=family_module, lora=lora)
    return {
        "file": lora.name,
        "path": os.path.abspath(path),
        "format": prepared.format,
        "family": family_module.id if family_module else None,
        "rank": _uniform(delta.rank for delta in lows),
        "alpha": _uniform(delta.alpha for delta in lows),
        "scale": _uniform(delta.scale for delta in lows),
        "counts": _tensor_counts(lora),
        "kinds": kind_summary(prepared.targets),
        "metadata": dict(lora.metadata),
        "contract": contract_to_dict(contract) or None,
        "accounting": _accounting(lora, model) if model is not None else None,
        "warnings": overflow_warnings(prepared.targets),
    }


_FLOAT32_MAX = 3.4028234663852886e38
_CHECKED_ROWS = 1024  # rows of a product computed at a time when its bound says it might overflow


def overflow_warnings(targets: dict) -> list:
    """One line per low-rank pair whose product ``scale · up @ down`` overflows float32 at strength 1: every value
    of the file is finite (the reader checks), yet the bind would fail on the NaN/Inf it makes. Cheap: the exact
    product is computed only for pairs whose bound ``scale · rank · max|up| · max|down|`` passes float32's
    range, which no real LoRA comes near."""
    import torch

    warnings = []
    for module, patch in targets.items():
        delta = patch.low_rank
        if delta is None or delta.kind != "lora":
            continue
        up = delta.up.float().reshape(delta.up.shape[0], -1)
        down = delta.down.float().reshape(delta.down.shape[0], -1)
        scale = abs(float(delta.scale))
        bound = scale * delta.rank * float(up.abs().max()) * float(down.abs().max())
        if bound <= _FLOAT32_MAX:
            continue
        if any(not bool(torch.isfinite((up[start:start + _CHECKED_ROWS] @ down) * scale).all())
               for start in range(0, up.shape[0], _CHECKED_ROWS)):
            warnings.append(f"{module}: scale x up @ down overflows float32 at strength 1 (largest |up| "
                            f"{float(up.abs().max()):.3g}, |down| {float(down.abs().max()):.3g}); binding this "
                            "file would fail")
    return warnings


def format_report(report: dict) -> str:
    lines = [
        f"{report['file']}",
        f"  format:   {report['format']}",
        f"  family:   {report['family'] or 'unknown (names of no known family)'}",
        f"  rank:     {_words(report['rank'])}   alpha: {_words(report['alpha'])}   "
        f"scale: {_words(report['scale'])}",
        "  tensors:  " + _tensor_words(report["counts"]),
    ]
    lines.extend(f"  kind:     {_kind_words(name, item)}" for name, item in report["kinds"].items())
    if report["metadata"]:
        lines.append("  metadata:")
        lines.extend(f"    {key}: {_shorten(value)}" for key, value in sorted(report["metadata"].items()))
    lines.append("  contract: " + _contract_words(report))
    lines.extend(f"  warning:  {line}" for line in report.get("warnings", []))
    accounting = report["accounting"]
    if accounting is not None:
        counts = accounting.get("counts", {})
        lines.append(
            f"  accounting against {accounting['model']} ({accounting['component']}): "
            f"{counts.get('applied', 0)} tensors applied (changing {accounting.get('parameters', 0)} model "
            f"parameters), {counts.get('expected_unmatched', 0)} expected-unmatched, "
            f"{counts.get('unmatched', 0)} unmatched"
        )
        for key, reason in (accounting.get("expected_unmatched") or {}).items():
            lines.append(f"    expected-unmatched {key}: {reason}")
        unmatched = accounting.get("unmatched") or []
        lines.extend(f"    unmatched {key}" for key in unmatched[:_SHOWN_UNMATCHED])
        if len(unmatched) > _SHOWN_UNMATCHED:
            lines.append(f"    ... and {len(unmatched) - _SHOWN_UNMATCHED} more unmatched (--json lists all)")
    return "\n".join(lines)


def _contract_words(report: dict) -> str:
    """The contract in words; a ``sampling_contract`` the metadata carries on a file whose keys name no family is
    said, not hidden behind "none declared": its words are read with a family's defaults, so it is not applied."""
    contract = report["contract"]
    if contract:
        return contract.get("text") or json.dumps(contract)
    declared = report["metadata"].get("sampling_contract")
    if declared is not None and report["family"] is None:
        return (f"not read: its metadata declares sampling_contract={declared!r}, but its keys name no known model "
                "family, so no model would take it (check the key prefix)")
    return "none declared (neither its file name nor its metadata declares one)"


def _words(value) -> str:
    """A report value in words: "none" for None, "0.5 or none (differs per pair)" for a mixed list."""
    if isinstance(value, list):
        return " or ".join(_words(v) for v in value) + " (differs per pair)"
    if value is None:
        return "none"
    return f"{value:g}" if isinstance(value, float) else str(value)


_KIND_WORDS = {"down": "down", "up": "up", "alpha": "alpha", "weight": "full weight diffs",
               "bias": "full bias diffs", "modulation": "modulation diffs", "other": "other"}


def _tensor_words(counts: dict) -> str:
    """"112 in all: 26 down + 26 up (low-rank pairs), 20 alpha, 10 full weight diffs, 28 full bias diffs, …"."""
    counts = dict(counts)
    total = counts.pop("total", 0)
    parts = []
    if "down" in counts or "up" in counts:
        parts.append(f"{counts.pop('down', 0)} down + {counts.pop('up', 0)} up (low-rank pairs)")
    parts += [f"{count} {_KIND_WORDS.get(kind, kind)}" for kind, count in counts.items()]
    return f"{total} in all: " + ", ".join(parts)


def _kind_words(name: str, item: dict) -> str:
    """"loha: 2 modules, 10 tensors, rank 4, alpha 2" (a DoRA: "dora on lora: ..."; full diffs: no rank/alpha)."""
    label = f"{name} on {'/'.join(item['on'])}" if item.get("on") else name
    words = f"{label}: {item['modules']} modules, {item['tensors']} tensors"
    if name == "diff":
        return words
    ranks = item["ranks"]
    return (f"{words}, rank {_words(ranks[0] if len(ranks) == 1 else ranks)}, "
            f"alpha {_words(item['alphas'][0] if len(item['alphas']) == 1 else item['alphas'] or None)}")


def _uniform(values):
    """The value when every target agrees, a sorted list when they differ, None when there is none.

    None is a value too: a file where only some pairs carry ``.alpha`` (LightX2V's global layers have none)
    reports ``[alpha, None]``, not the alpha of some pairs as if it applied to all."""
    distinct = set(values)
    if len(distinct) <= 1:
        return distinct.pop() if distinct else None
    return sorted(v for v in distinct if v is not None) + ([None] if None in distinct else [])


def _tensor_counts(lora) -> dict:
    """Tensors of the file by part: down/up factors, alpha scalars, full weight/bias/modulation diffs."""
    counts: dict = {}
    for patch in lora.targets.values():
        for part, keys in patch.source_keys.items():
            counts[part] = counts.get(part, 0) + len(keys)
    order = ("down", "up", "alpha", "weight", "bias", "modulation")
    ordered = {kind: counts[kind] for kind in order if kind in counts}
    ordered.update({kind: count for kind, count in counts.items() if kind not in ordered})
    ordered["total"] = sum(counts.values())
    return ordered


def _accounting(lora, model) -> dict:
    """The key accounting on the component the file targets: the one the model's family puts it in (Wan2.2:
    low-noise files -> the low-noise expert), else the main denoiser. Unmatched keys are listed (and exit 1
    through ``refusal``); a shape that does not fit raises like a fuse would."""
    # lazy: the CLI's parser imports every command module; the engine loads when it runs
    from ...loaders.families import family_for, guess_family
    from ...loaders.lora.preparation import prepare_lora

    family = family_for(model)
    component = family.layout.component_for_file(model.model_index, lora.name, strict=False)
    prepared = prepare_lora(lora.path, model, component, family, guess_family=guess_family, name=lora.name,
                            lenient=True, where="lorabind inspect")
    accounting = prepared.accounting
    return {"model": model.name or model.path, "model_family": model.family, "component": component,
            **accounting.to_dict(), "refusal": accounting.refusal or None}


def _shorten(value, limit: int = 120) -> str:
    text = str(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
