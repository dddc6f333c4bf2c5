"""``lorabind run WORKFLOW.json``: execute a ComfyUI workflow (UI or API format) headless.

Module-level imports stay light (no torch): ``lorabind --help`` imports every command module. The node classes
and the built-in tiny models are loaded inside ``run`` through ``load_node_classes`` / ``ensure_models``,
two small seams tests replace with fakes.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import uuid

from ...loaders.io import json_limits
from .run_messages import describe_outputs, format_execution_error, format_node_errors, format_validation_failure


class RunError(Exception):
    """A user-facing problem with the command line or the workflow file."""


def add_arguments(parser) -> None:
    # lazy: the CLI's parser imports every command module; the engine loads when it runs
    from ..device_options import add_device_arguments
    from ..parallel.options import add_parallel_arguments

    parser.add_argument("workflow", metavar="WORKFLOW.json", help="workflow saved from ComfyUI (UI or API format)")
    parser.add_argument("--models", metavar="DIR", help="models root (default: $LORABIND_MODELS or ./models)")
    parser.add_argument("--output", metavar="DIR", help="output directory (default: ./output)")
    parser.add_argument("--input", metavar="DIR", help="input directory (default: ./input)")
    parser.add_argument("--tokenizer", metavar="DIR", action="append", default=[],
                        help="a tokenizer folder for single-file text encoders that carry none (Qwen2.5-VL); "
                             "models/tokenizers/ is also searched")
    parser.add_argument("--set", metavar="NODE.INPUT=VALUE", action="append", default=[], dest="overrides",
                        help="override one node input; VALUE is parsed as JSON, else taken as a string "
                        "(repeatable), e.g. --set 3.seed=42 --set 6.text=\"a cat\"")
    parser.add_argument("--input-file", metavar="NODE=PATH", action="append", default=[], dest="input_files",
                        help="an image for a LoadImage node, read where it is (outside the input folder too), "
                             "e.g. --input-file 3=~/photos/start.png (repeatable)")
    parser.add_argument("--download", action="store_true",
                        help="fetch the model files the workflow names that are not under --models first (`lorabind "
                             "models download`'s code); without it a missing file is named with the command")
    parser.add_argument("--preview", metavar="DIR",
                        help="write the sampler's live preview of every step into DIR (JPEG, latent2rgb, the first "
                        "frame): node<ID>_step<K>of<N>.jpg")
    add_device_arguments(parser)
    add_parallel_arguments(parser)


def load_node_classes() -> tuple[dict, dict]:
    """(class mappings, display names): the pack's nodes plus ComfyUI's core LoadImage/SaveImage/PreviewImage;
    imports the node modules (and torch)."""
    # lazy: the CLI's parser imports every command module; the engine loads when it runs
    from ..core_nodes import runtime_node_classes

    return runtime_node_classes()


def ensure_models(prompt: dict, models_root: str, input_dir: str) -> None:
    """Build any built-in tiny model (and example input image) the prompt names that is missing, saying so
    first."""
    # lazy: the CLI's parser imports every command module; the engine loads when it runs
    from ...tiny_models import ensure_builtin_models

    ensure_builtin_models(prompt, models_root, input_dir, announce=lambda line: print(line, flush=True))


def contract_refusals(prompt: dict, node_classes: dict) -> list:
    """``[(node id, input, "Error: ...")]``: samplers whose steps, scheduler, shift, cfg or expert split a file's
    contract contradicts, and LoRAs of another model family than their model, found from the prompt alone (no
    model loaded, no text encoded: on a real 14B model the sampler or the fuse would say so only minutes later)."""
    # lazy: the CLI's parser imports every command module; the engine loads when it runs
    from ...usecases.prompt_contracts import early_refusals_by_input, wrong_family_refusals
    from .. import folder_paths

    return ([(node_id, name, f"ContractError: {message}")
             for node_id, name, message in early_refusals_by_input(prompt, node_classes, folder_paths)]
            + [(node_id, name, f"KeyMatchError: {name}: {message}")
               for node_id, name, message in wrong_family_refusals(prompt, node_classes, folder_paths)])


def run(args) -> int:
    # lazy: the CLI's parser imports every command module; the engine loads when it runs
    from ...loaders.distributed.spec import ParallelSpecError
    from ..device_options import apply_device_arguments
    from ..parallel.options import parallel_spec, refusal

    device_error = apply_device_arguments(args)
    if device_error:
        print(f"lorabind run: {device_error}", file=sys.stderr)
        return 2
    try:
        spec = parallel_spec(args)
    except ParallelSpecError as exc:
        print(f"lorabind run: {exc}", file=sys.stderr)
        return 2
    refused = refusal(spec)
    if refused:
        print(f"lorabind run: --parallel {spec.describe()}: {refused}", file=sys.stderr)
        return 2
    if getattr(args, "preview", None) and os.path.exists(args.preview) and not os.path.isdir(args.preview):
        print(f"lorabind run: --preview {args.preview}: not a folder", file=sys.stderr)
        return 2
    if not spec.is_parallel:
        return _run_here(args)
    return _run_parallel(args, spec)


def _run_parallel(args, spec) -> int:
    """Inside a job (torchrun's or ours): run as this rank. Outside: check the prompt here (a refusal before any
    rank starts or loads), then start the ranks."""
    # lazy: the CLI's parser imports every command module; the engine loads when it runs
    from ...loaders.distributed.process_group import ParallelRunError
    from ..parallel.job_environment import checked_job_request, job_environment
    from ..parallel.launch import launch_ranks

    hosted = _group_made_by_host()
    try:
        checked_job_request(spec, args.parallel_interface, args.rank_timeout,
                            starting_ranks="RANK" not in os.environ and not hosted)
        job = None if hosted else job_environment(args.parallel_interface)
    except ParallelRunError as exc:
        print(f"lorabind run: {exc}", file=sys.stderr)
        return 2
    if job is None and not hosted:
        prepared = _prepare(args)
        if isinstance(prepared, int):
            return prepared
        print(f"lorabind run: --parallel {spec.describe()}: starting {spec.world_size} ranks", flush=True)
        return launch_ranks(spec.world_size, list(getattr(args, "argv", None) or sys.argv[1:]),
                            interface=args.parallel_interface)
    return _run_as_rank(args, spec, job)


def _group_made_by_host() -> bool:
    """A host (a test harness) that made the process group itself runs the command on each of its ranks."""
    # lazy: the CLI's parser imports every command module; the engine loads when it runs
    import torch.distributed as dist

    return dist.is_initialized()


def _run_as_rank(args, spec, job) -> int:
    # lazy: the CLI's parser imports every command module; the engine loads when it runs
    from ...loaders.distributed.process_group import ParallelRunError
    from ..parallel.ranks import rank_of_job, rank_zero_builds_first, unseen_rank
    from ..parallel.run_ranks import RankRun, quiet_interrupt_until_running

    rank = job.rank if job is not None else "?"
    try:
        with quiet_interrupt_until_running(), rank_of_job(spec, job) as joined:
            rank = joined.rank
            with RankRun(joined).running() as rank_run:
                if joined.seen:
                    return _run_here(args, models_turn=rank_zero_builds_first, rank_run=rank_run)
                with unseen_rank() as (scratch, null):
                    return _run_here(args, output_dir=scratch, progress_stream=null,
                                     models_turn=rank_zero_builds_first, rank_run=rank_run)
    except ParallelRunError as exc:
        print(f"lorabind run: rank {rank}: {exc}", file=sys.stderr)
        return 2


def _prepare(args, output_dir: str | None = None, models_turn=contextlib.nullcontext):
    """Everything before execution: folders, the prompt, the built-in models, validation and the early contract
    check. Returns (prompt, kind, workflow, changed, node classes, executor, validation) or an exit code.
    ``models_turn`` orders the ranks of a job around building missing built-in models (one builder at a time)."""
    # lazy: the CLI's parser imports every command module; the engine loads when it runs
    from .. import folder_paths
    from ..executor import PromptExecutor
    from ..missing_files import fetch_or_name

    folder_paths.configure(models_root=args.models, output_dir=output_dir or args.output, input_dir=args.input,
                           temp_dir=output_dir)  # an unseen rank's previews go to its scratch folder too
    for tokenizer_dir in args.tokenizer:
        folder_paths.add_model_folder_path("tokenizers", tokenizer_dir, is_default=True)
    read = _read_prompt(args)
    if read is None:
        return 1
    prompt, kind, workflow, changed, node_classes = read
    try:
        with models_turn():  # one rank at a time: the first builds (and, with --download, fetches) what is missing
            ensure_models(prompt, folder_paths.models_dir, folder_paths.get_input_directory())
            missing = fetch_or_name(prompt, workflow, args.workflow, args.models or folder_paths.models_dir,
                                    fetch=args.download, say=print)
    except Exception as exc:
        print(f"lorabind run: cannot prepare the built-in models under {folder_paths.models_dir}: {exc}",
              file=sys.stderr)
        return 1
    if missing:  # the files the workflow names that are not there: validation says which folders were searched
        print(f"lorabind run: {missing}", file=sys.stderr)
    executor = PromptExecutor(node_classes)
    validation = executor.validate(prompt)
    if _refused_before_running(validation, prompt, node_classes):
        return 1
    return prompt, kind, workflow, changed, node_classes, executor, validation


def _run_here(args, output_dir: str | None = None, progress_stream=None, models_turn=contextlib.nullcontext,
              rank_run=None) -> int:
    """Run the prompt in this process, alone or as one rank of a job (``rank_run``: its ``RankRun``, which runs
    the prompt on the job's protocol and says whether this rank reports the result)."""
    # lazy: the CLI's parser imports every command module; the engine loads when it runs
    from .. import folder_paths
    from ..executor.graph import upstream_closure
    from ..progress_display import ProgressDisplay

    prepared = _prepare(args, output_dir, models_turn)
    if isinstance(prepared, int):
        return prepared
    prompt, kind, workflow, changed, node_classes, executor, validation = prepared
    extra_data = {"extra_pnginfo": {"workflow": workflow}} if kind == "ui" else {}
    display = ProgressDisplay(prompt, len(upstream_closure(prompt, validation.outputs)), stream=progress_stream)
    on_event = display.on_event
    if getattr(args, "preview", None) and output_dir is None:  # an unseen rank of a job writes none
        extra_data, on_event = _with_previews(args.preview, extra_data, on_event)
    try:
        if rank_run is None:
            result = executor.execute(prompt, uuid.uuid4().hex, extra_data=extra_data, on_event=on_event,
                                      execute_outputs=validation.outputs)
        else:
            result = rank_run.execute(executor, prompt, extra_data, on_event, validation.outputs)
    finally:
        display.close()
    if result.interrupted or not result.success:
        if rank_run is None or rank_run.reports(result):
            print("lorabind run: interrupted" if result.interrupted else
                  format_execution_error(result.error, prompt, changed), file=sys.stderr)
        return 130 if result.interrupted else 1
    for line in describe_outputs(result.outputs, prompt, folder_paths.get_directory_by_type):
        print(line)
    return 0


def _with_previews(folder: str, extra_data: dict, on_event) -> tuple:
    """``--preview DIR``: every step previewed (latent2rgb) and each preview written into ``folder``."""
    # lazy: the CLI's parser imports every command module; the engine loads when it runs
    from ..preview_options import EXTRA_DATA_KEY, PreviewOptions
    from ..progress_display import PreviewFolder

    previews = PreviewFolder(folder)
    settings = PreviewOptions("latent2rgb", interval_ms=0).for_prompt({})

    def both(name: str, data: dict) -> None:
        on_event(name, data)
        previews.on_event(name, data)

    return {**extra_data, EXTRA_DATA_KEY: settings}, both


def _read_prompt(args):
    """(prompt, "api" | "ui", workflow, changed inputs, node classes) of ``args.workflow`` with the command
    line's changes applied; None, after saying why, when it cannot be read or converted."""
    # lazy: the CLI's parser imports every command module; the engine loads when it runs
    from ..workflow_format import WorkflowFormatError, to_api_prompt
    from ..workflow_mode_notes import older_frontend_differences
    from ..workflow_overrides import OverrideError

    try:
        workflow = _load_json(args.workflow)
        node_classes, display_names = load_node_classes()
        prompt, kind = to_api_prompt(workflow, node_classes, display_names)
        nodes_text = f"{len(prompt)} node" + ("" if len(prompt) == 1 else "s")
        if kind == "ui":
            print(f"{args.workflow}: UI workflow, converted to an API prompt of {nodes_text}")
            for note in older_frontend_differences(workflow):
                print(f"warning: {note}", file=sys.stderr)
        else:
            print(f"{args.workflow}: API prompt of {nodes_text}")
        changed, workflow = _apply_command_line_changes(prompt, workflow, kind, args, node_classes, display_names)
    except (RunError, OverrideError) as exc:
        print(f"lorabind run: {exc}", file=sys.stderr)
        return None
    except WorkflowFormatError as exc:
        print(f"lorabind run: {args.workflow}: {exc}", file=sys.stderr)
        return None
    return prompt, kind, workflow, changed, node_classes


def _refused_before_running(validation, prompt: dict, node_classes: dict) -> bool:
    """Print why the prompt cannot run (validation, or a contract contradicted by the prompt alone) and say so;
    warn about outputs validation skips."""
    if not validation.ok:
        print(format_validation_failure(validation.error, validation.node_errors), file=sys.stderr)
        return True
    if validation.node_errors:
        print("warning: some outputs are skipped:\n" + format_node_errors(validation.node_errors), file=sys.stderr)
    refusals = contract_refusals(prompt, node_classes)
    if refusals:
        print("\n".join(f"lorabind run: node {node_id} ({prompt[node_id].get('class_type')}) refused before any "
                        f"model was loaded: {message}" for node_id, _, message in refusals),
              file=sys.stderr)
        return True
    return False


def _apply_command_line_changes(prompt: dict, workflow, kind: str, args, node_classes: dict, display_names: dict):
    """``--set`` and ``--input-file`` on the prompt and, for a UI workflow, on the copy embedded in the outputs;
    says which files are read from where. Returns ({node_id: {input: value}}, the workflow to embed)."""
    # lazy: the CLI's parser imports every command module; the engine loads when it runs
    from ..workflow_overrides import apply_input_files, apply_overrides, embed_overrides

    changed = apply_overrides(prompt, args.overrides, node_classes)
    files, lines = apply_input_files(prompt, args.input_files, node_classes)
    for line in lines:
        print(line)
    for node_id, inputs in files.items():
        changed.setdefault(node_id, {}).update(inputs)
    if kind == "ui" and changed:
        workflow, not_embedded = embed_overrides(workflow, changed, node_classes, display_names)
        for note in not_embedded:
            print(f"warning: {note}", file=sys.stderr)
    return changed, workflow


def _load_json(path: str):
    try:
        with open(path, encoding="utf-8") as handle:
            return json_limits.load(handle)
    except FileNotFoundError:
        raise RunError(f"workflow file '{path}' does not exist") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise RunError(f"cannot read workflow file '{path}': {exc}") from None
    except json.JSONDecodeError as exc:
        raise RunError(f"workflow file '{path}' is not valid JSON: {exc}") from None
