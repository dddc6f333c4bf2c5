"""``--parallel`` and the serving guide's spellings of the same degrees, on ``lorabind run`` and ``serve``.

Why accept the guide's flags: users arrive with ``--ulysses-degree 2 --cfg-parallel-size 2`` in their scripts;
each is read into the same ``ParallelSpec`` as ``--parallel ulysses=2,cfg=2``. Torch-free (the CLI's parser).
"""

from __future__ import annotations

from ...loaders.distributed.spec import GUIDE_FLAGS, ParallelSpec, parse_parallel, with_guide_flag

# Why tp runs alone in this build: diffusers gives a model one parallel config (a split model refuses a second one),
# and a CFG split over sharded weights would need a tensor-parallel group per guidance branch, which we do not build.
TP_ALONE = ("tp={tp} cannot be combined with {others} in this build: a model split by tensor parallelism takes no "
            "sequence split (diffusers keeps one parallel config per model), and a CFG split would need a "
            "tensor-parallel group per branch; use tp=N alone, or ulysses=/ring=/cfg= without tp")


def add_parallel_arguments(parser) -> None:
    parser.add_argument("--parallel", metavar="SPEC", default=None,
                        help="split one model over several processes: ulysses=N, ring=N, cfg=2, tp=N, combined "
                        "with commas (e.g. ulysses=2,cfg=2); the ranks are the product of the degrees. The "
                        "command starts them itself, or runs as one of them under torchrun")
    for name, flag in GUIDE_FLAGS.items():
        parser.add_argument(flag, metavar="N", default=None, dest=f"guide_{name}",
                            help=f"the serving guide's spelling of --parallel {name}=N")


def parallel_spec(args) -> ParallelSpec:
    """The spec the command line asks for (``ParallelSpecError`` naming the flag and the part otherwise)."""
    text = getattr(args, "parallel", None)
    spec = parse_parallel(text) if text else ParallelSpec()
    for name, flag in GUIDE_FLAGS.items():
        value = getattr(args, f"guide_{name}", None)
        if value is not None:
            spec = with_guide_flag(spec, name, value, flag)
    return spec


def refusal(spec: ParallelSpec) -> str | None:
    """Why this build cannot run ``spec`` (None: it can)."""
    others = [f"{name}={getattr(spec, name)}" for name in ("ulysses", "ring", "cfg") if getattr(spec, name) > 1]
    if spec.tp > 1 and others:
        return TP_ALONE.format(tp=spec.tp, others=", ".join(others))
    return None
