"""``--parallel`` and the serving guide's spellings of the same degrees, on ``lorabind run`` and ``serve``.

Why accept the guide's flags: users arrive with ``--ulysses-degree 2 --cfg-parallel-size 2`` in their scripts;
each is read into the same ``ParallelSpec`` as ``--parallel ulysses=2,cfg=2``. Torch-free (the CLI's parser).
"""

from __future__ import annotations

from ...loaders.distributed.spec import GUIDE_FLAGS, ParallelSpec, parse_parallel, with_guide_flag

# Why tp takes no sequence split: diffusers gives a model one parallel config (``enable_parallelism`` refuses a
# model already split), and its context-parallel plans scatter the attention over all the heads, which tp has
# already divided among its ranks. tp with cfg=2 runs: each guidance pass on its own tp group of N ranks.
TP_WITHOUT_SEQUENCE = ("tp={tp} cannot be combined with {others}: a model split by tensor parallelism takes no "
                       "sequence split (diffusers keeps one parallel config per model, and its context-parallel "
                       "plans split the attention over the heads tp already divides); use tp=N (with cfg=2 if "
                       "you like), or ulysses=/ring= without tp")

def add_parallel_arguments(parser) -> None:
    parser.add_argument("--parallel", metavar="SPEC", default=None,
                        help="split one model over several processes: ulysses=N, ring=N, cfg=2, tp=N, combined "
                        "with commas (e.g. ulysses=2,cfg=2); the ranks are the product of the degrees. The "
                        "command starts them itself, or runs as one of them under torchrun")
    for name, flag in GUIDE_FLAGS.items():
        parser.add_argument(flag, metavar="N", default=None, dest=f"guide_{name}",
                            help=f"the serving guide's spelling of --parallel {name}=N")
    parser.add_argument("--parallel-interface", metavar="NAME", default=None,
                        help="the network interface every socket of a --parallel job listens on (the job's store, "
                        "gloo/NCCL); default: loopback only. A job across hosts names one, e.g. eth0 "
                        "($LORABIND_PARALLEL_INTERFACE)")
    parser.add_argument("--rank-timeout", metavar="SECONDS", default=None,
                        help="how long a rank of a --parallel job may show no sign of life before it is declared "
                        "stalled, its prompt fails naming it and the job starts its ranks again (default 60; "
                        "$LORABIND_RANK_TIMEOUT_S)")


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
    others = [f"{name}={getattr(spec, name)}" for name in ("ulysses", "ring") if getattr(spec, name) > 1]
    if spec.tp > 1 and others:
        return TP_WITHOUT_SEQUENCE.format(tp=spec.tp, others=", ".join(others))
    return None
