"""``lorabind serve``: run the ComfyUI-compatible HTTP/WebSocket API.

Flag names are ComfyUI's so scripts that start ComfyUI can start us the same way. aiohttp and the executor
are imported only inside ``run`` (``lorabind --help`` stays fast).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path


def add_arguments(parser) -> None:
    # lazy: the CLI's parser imports every command module; the engine loads when it runs
    from ..device_options import add_device_arguments
    from ..parallel.options import add_parallel_arguments
    from ..preview_options import add_preview_arguments

    parser.add_argument("--listen", nargs="?", const="0.0.0.0,::", default="127.0.0.1", metavar="IP",
                        help="address(es) to listen on, comma separated (default 127.0.0.1; bare flag: all)")
    parser.add_argument("--port", type=int, default=8188, help="port (default 8188)")
    parser.add_argument("--models", default=os.environ.get("LORABIND_MODELS", "models"), metavar="DIR",
                        help="models root (default ./models or $LORABIND_MODELS)")
    parser.add_argument("--output", default="output", metavar="DIR", help="output folder (default ./output)")
    parser.add_argument("--input", default="input", metavar="DIR", help="input/upload folder (default ./input)")
    parser.add_argument("--temp", default="temp", metavar="DIR", help="temp folder (default ./temp)")
    parser.add_argument("--state-dir", default=None, metavar="DIR",
                        help="server state (history); default: .lorabind-state beside the output folder. Must not "
                        "be inside the output, input or temp folders")
    parser.add_argument("--allowed-hosts", default="", metavar="NAMES",
                        help="comma-separated Host names a loopback-bound server also answers to (default: "
                        "loopback names only, which blocks DNS rebinding); '*' allows any")
    parser.add_argument("--enable-cors-header", nargs="?", const="*", default=None, metavar="ORIGIN",
                        help="send CORS headers for ORIGIN (bare flag: '*') instead of refusing cross-origin "
                        "browser requests")
    parser.add_argument("--max-upload-size", type=float, default=100.0, metavar="MB",
                        help="largest accepted request body in MB (default 100)")
    add_device_arguments(parser)
    parser.add_argument("--max-cached-adapters", type=int, default=None, metavar="N",
                        help="dynamic (PEFT) adapters each model keeps injected for fast switching (default 4)")
    parser.add_argument("--preload-adapter", nargs="+", default=(), metavar="NAME",
                        help="LoRA files/PEFT folders under models/loras read at start and never evicted from "
                             "the adapter cache")
    parser.add_argument("--ray", nargs="?", const="local", default=None, metavar="ADDRESS",
                        help="run prompts on Ray Serve replicas (needs pip install \"lorabind[ray]\"): 'auto' or "
                        "HOST:PORT joins a running cluster (ray start --head); the bare flag starts one here")
    parser.add_argument("--replicas", type=int, default=2, metavar="N",
                        help="with --ray: number of replicas, one GPU each when the cluster has GPUs (default 2)")
    add_batching_arguments(parser)
    add_preview_arguments(parser, default_method="auto")
    add_openai_arguments(parser)
    add_parallel_arguments(parser)


MAX_BATCH_LIMIT = 64  # prompts in flight at once: each holds its latents, text and outputs in memory


def add_batching_arguments(parser) -> None:
    """The step engine's size (docs/serving/many-users.md), in our spelling and vllm-omni's."""
    parser.add_argument("--max-batch", "--max-num-seqs", type=int, default=1, dest="max_batch", metavar="N",
                        help="prompts in flight at once (vllm-omni's --max-num-seqs): their denoising steps run "
                        "batched, a prompt that arrives joins at the next step, and LoRAs that differ between "
                        f"requests run on their own rows; 1 (default) runs one prompt at a time (at most "
                        f"{MAX_BATCH_LIMIT})")
    parser.add_argument("--step-execution", action="store_true",
                        help="vllm-omni's switch for step-wise execution, accepted: lorabind always runs a "
                        "prompt's denoising step by step; --max-batch N above 1 batches the steps of N prompts")


def batching_refusal(max_batch: int, spec, ray) -> str | None:
    """Why ``--max-batch`` cannot be this here (None: it can)."""
    if not 1 <= max_batch <= MAX_BATCH_LIMIT:
        return f"--max-batch (--max-num-seqs) must be from 1 to {MAX_BATCH_LIMIT}, got {max_batch}"
    if max_batch > 1 and spec.cfg > 1:
        return (f"--parallel {spec.describe()} with --max-batch {max_batch}: cfg=2 exchanges each prompt's two "
                "guidance passes between ranks outside the batched forward, so prompts in flight would meet in "
                "that exchange out of order; batch with ulysses=, ring= or tp=, or use cfg=2 with --max-batch 1")
    if max_batch > 1 and spec.is_parallel and ray is not None:
        return (f"--ray with --parallel {spec.describe()} runs one prompt at a time on each replica's ranks; "
                f"--max-batch {max_batch} is for replicas of one process, or serve --parallel without --ray")
    return None


def add_openai_arguments(parser) -> None:
    """The OpenAI-style endpoints (/v1/...) and LoRA the vllm-omni way (its flag names)."""
    # lazy: the CLI's parser imports every command module; the engine loads when it runs
    from ..guide_flags import add_serve_guide_arguments

    parser.add_argument("--openai-model", action="append", default=[], metavar="NAME=WORKFLOW.api.json",
                        help="serve the API workflow as model NAME on /v1/chat/completions, /v1/images/generations "
                        "and /v1/videos; its nodes' _meta.openai say which inputs the request fields set "
                        "(repeatable). A repository id (Wan-AI/Wan2.2-T2V-A14B-Diffusers, Qwen/Qwen-Image) serves "
                        "that model's real-size workflow (workflows/real/) when its files are under --models")
    parser.add_argument("--download", action="store_true",
                        help="fetch the files a repository id's workflow needs first (`lorabind models download`'s "
                        "code); without it a missing file stops serve with the command that gets it")
    parser.add_argument("--lora-backend", choices=("peft", "distill"), default="peft",
                        help="what --lora-path files are: distill = fused into every served model they fit for the "
                        "server's lifetime (Wan2.2: high then low); peft (default) = adapters preloaded into the "
                        "cache for requests to use")
    parser.add_argument("--lora-path", nargs="+", default=(), metavar="FILE",
                        help="LoRA files (paths inside the LoRA folders, or names under models/loras)")
    parser.add_argument("--allow-lora-dir", action="append", default=[], metavar="DIR",
                        help="another folder LoRA names and request adapter paths may come from (repeatable); "
                        "everything else outside models/loras is refused")
    add_serve_guide_arguments(parser)


def run(args) -> int:
    listeners = bind_rank_zero_first(args)
    if isinstance(listeners, int):
        return listeners
    return _run(args, listeners)


def bind_rank_zero_first(args):
    """``serve --parallel`` (outside Ray): rank 0's HTTP sockets, bound before anything heavy is imported, so a
    taken port is one line at once rather than a failure after every rank has started; None on any other serve
    (which binds first thing in ``run_server``), 2 when the port is taken."""
    spec = parallel_spec_of(args)
    if isinstance(spec, str) or not spec.is_parallel or args.ray is not None or os.environ.get("RANK", "0") != "0":
        return None
    # lazy: the CLI's parser imports every command module
    from ..listen import PortUnavailable, bind_listeners

    try:
        return bind_listeners([h.strip() for h in args.listen.split(",") if h.strip()], args.port)
    except PortUnavailable as exc:
        print(f"lorabind serve: {exc}")
        return 2


def _run(args, listeners) -> int:
    # lazy: the CLI's parser imports every command module; the engine loads when it runs
    from ..device_options import apply_device_arguments
    from ..guide_flags import apply_serve_guide_arguments, serve_guide_notes
    from ..preview_options import preview_options
    from ..server import ServerConfig, run_server

    previews = preview_options(args)
    device_error = apply_device_arguments(args) or (previews if isinstance(previews, str) else None)
    if device_error:
        print(f"lorabind serve: {device_error}")
        return 2
    if args.max_upload_size <= 0:
        print("lorabind serve: --max-upload-size must be a positive number of MB")
        return 2
    openai_error = check_openai_arguments(args) or apply_serve_guide_arguments(args)
    if openai_error:
        print(f"lorabind serve: {openai_error}")
        return 2
    for note in serve_guide_notes(args):
        print(f"lorabind serve: {note}")
    spec = parallel_spec_of(args)
    if isinstance(spec, str):
        print(f"lorabind serve: {spec}")
        return 2
    batching_error = batching_refusal(args.max_batch, spec, args.ray)
    if batching_error:
        print(f"lorabind serve: {batching_error}")
        return 2
    cache_error = apply_adapter_cache_arguments(args)
    if cache_error:
        print(f"lorabind serve: {cache_error}")
        return 2
    if args.ray is not None:
        if args.replicas < 1:
            print("lorabind serve: --replicas must be at least 1")
            return 2
        try:
            import ray  # noqa: F401  (only to say clearly what is missing)
            from ray import serve  # noqa: F401
        except ImportError:
            print('lorabind serve --ray: Ray Serve is not installed; pip install "lorabind[ray]"')
            return 2
    config = ServerConfig(listen=args.listen, port=args.port, models_root=args.models, output_dir=args.output,
                          input_dir=args.input, temp_dir=args.temp, cors_origin=args.enable_cors_header,
                          max_upload_mb=args.max_upload_size, state_dir=args.state_dir, ray_address=args.ray,
                          replicas=args.replicas, openai_models=tuple(args.openai_models),
                          distill_loras=tuple(args.lora_path) if args.lora_backend == "distill" else (),
                          lora_dirs=tuple(args.allow_lora_dir), max_batch=args.max_batch, previews=previews,
                          allowed_hosts=tuple(h.strip().lower() for h in args.allowed_hosts.split(",") if h.strip()))
    if spec.is_parallel and args.ray is None:
        return serve_parallel(args, config, spec, listeners)
    if spec.is_parallel:  # each Ray replica a group of that many ranks (runtime/scale_out/rank_group.py)
        config.parallel = spec
    try:
        run_server(config)
    except ValueError as exc:  # a configuration the server refuses (e.g. a state folder uploads could reach)
        print(f"lorabind serve: {exc}")
        return 2
    return 0


def serve_parallel(args, config, spec, listeners) -> int:
    """``serve --parallel`` outside Ray, ``listeners`` bound already (on rank 0): check the job's flags, then run
    as its rank 0 (starting the others) or as the rank torchrun made this process."""
    # lazy: only a --parallel server starts ranks (torch, the executor)
    from ...loaders.distributed.process_group import ParallelRunError
    from ..parallel.job_environment import checked_job_request
    from ..server.parallel_job import serve_job

    try:
        rank_timeout_s = checked_job_request(spec, args.parallel_interface, args.rank_timeout,
                                             starting_ranks="RANK" not in os.environ)
    except ParallelRunError as exc:
        print(f"lorabind serve: {exc}")
        return 2
    return serve_job(config, spec, list(getattr(args, "argv", None) or sys.argv[1:]), listeners=listeners,
                     interface=args.parallel_interface, rank_timeout_s=rank_timeout_s)


def parallel_spec_of(args):
    """The ``--parallel`` spec (or the guide's flags), or an error text naming the flag."""
    # lazy: the CLI's parser imports every command module; the engine loads when it runs
    from ...loaders.distributed.spec import ParallelSpecError
    from ..parallel.options import parallel_spec, refusal

    try:
        spec = parallel_spec(args)
    except ParallelSpecError as exc:
        return str(exc)
    refused = refusal(spec)
    return f"--parallel {spec.describe()}: {refused}" if refused else spec


def check_openai_arguments(args) -> str | None:
    """``--openai-model NAME=FILE`` pairs (kept in ``args.openai_models``), the files of one given as a repository
    id (``repository_files``) and the ``--allow-lora-dir`` folders (with the peft backend,
    ``apply_adapter_cache_arguments`` preloads the ``--lora-path`` files). An error text, or None."""
    # lazy: the CLI's parser imports every command module; the engine loads when it runs
    from ..server.openai.templates import parse_model_option

    try:
        args.openai_models = [parse_model_option(option) for option in args.openai_model]
    except ValueError as exc:
        return str(exc)
    for folder in args.allow_lora_dir:
        if not os.path.isdir(folder):
            return f"--allow-lora-dir {folder}: not a folder"
    if args.lora_backend == "distill" and not args.lora_path:
        return ("--lora-backend distill needs --lora-path FILE... (the distill LoRA files to fuse at start); without "
                "them it would fuse nothing")
    return repository_files(args) or None


def repository_files(args) -> str:
    """Each ``--openai-model`` given as a repository id: its workflow's files are under ``--models`` (fetched first
    with ``--download``), or the one line naming the command that gets them ("" when all are there)."""
    repositories = [(name, path) for option, (name, path) in zip(args.openai_model, args.openai_models)
                    if "=" not in option]
    if not repositories:
        return ""
    # lazy: the CLI's parser imports every command module; the engine loads when it runs
    from ...loaders.io import json_limits
    from .. import folder_paths
    from ..missing_files import fetch_or_name

    folder_paths.configure(models_root=args.models)
    for name, path in repositories:
        prompt = json_limits.loads(Path(path).read_bytes())
        problem = fetch_or_name(prompt, prompt, path, args.models, fetch=args.download, say=print)
        if problem:
            return f"--openai-model {name}: {problem}"
    return ""


def apply_adapter_cache_arguments(args) -> str | None:
    """``--max-cached-adapters`` / ``--preload-adapter`` (and, with the peft backend, ``--lora-path``): the adapter
    cache's session defaults; preloaded files are read now (a bad name or file fails at start, not at the first
    prompt), pinned, and said. An error text, or None."""
    lora_paths = args.lora_path if args.lora_backend == "peft" else ()
    if args.max_cached_adapters is None and not args.preload_adapter and not lora_paths:
        return None
    if args.max_cached_adapters is not None and args.max_cached_adapters < 1:
        return "--max-cached-adapters must be at least 1"
    # lazy: the CLI's parser imports every command module; the engine loads when it runs
    from ...loaders.binding.bind import set_adapter_cache_defaults
    from ...loaders.errors import LoraBindError
    from ...loaders.lora import read_lora
    from .. import folder_paths

    folder_paths.configure(models_root=args.models)
    for folder in args.allow_lora_dir:  # the folders a --lora-path (as a request's lora.path) may come from
        folder_paths.add_model_folder_path("loras", folder)
    named, error = _lora_path_names(lora_paths)
    if error:
        return error
    paths = []
    for flag, name in [("--preload-adapter", n) for n in args.preload_adapter] + named:
        path = folder_paths.get_full_path("loras", name)
        if path is None:
            return f"{flag} {name}: not found under {args.models}/loras"
        try:
            lora = read_lora(path)
        except LoraBindError as exc:
            return f"{flag} {name}: {exc}"
        paths.append(path)
        print(f"lorabind serve: preloaded adapter {name} ({lora.format}, {len(lora.targets)} modules; pinned in "
              "the adapter cache for requests to use)")
    set_adapter_cache_defaults(max_size=args.max_cached_adapters, pinned_paths=paths)
    return None


def _lora_path_names(lora_paths) -> tuple:
    """``([("--lora-path", name in the LoRA folders)], None)``, or ``([], error text)``: a ``--lora-path`` is
    confined exactly as a request's ``lora.path`` (absolute, or relative to a LoRA folder; inside the LoRA folders
    or an ``--allow-lora-dir``, links resolved)."""
    # lazy: the CLI's parser imports every command module; the engine loads when it runs
    from ..server.openai.errors import OpenAIRequestError
    from ..server.openai.loras import confined_lora_name

    named = []
    for path in lora_paths:
        try:
            named.append(("--lora-path", confined_lora_name(path)))
        except OpenAIRequestError as exc:
            return [], f"--lora-path: {exc.message}".replace("lora.path ", "")
    return named, None
