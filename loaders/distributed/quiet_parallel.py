"""Two diffusers warnings every ``--parallel`` run printed, once per rank, dropped where they are said.

* "`enable_parallelism` is an experimental feature ...": said by every ``ModelMixin.enable_parallelism`` call,
  whatever the model; a user of ``--parallel ulysses=2`` can do nothing about it, and the rest of the output is
  rank 0's alone.
* "Expected input tensor to have 2 dimensions, but got 1 dimensions, split will not be applied.": Wan's
  context-parallel plan splits a per-token timestep (Wan2.2 TI2V's, 2-D); every other Wan model passes one
  timestep per sample (1-D), which is not to be split, and diffusers says so on the first step.

Only these two exact lines are dropped; every other diffusers warning still shows. Why a filter on the two
loggers rather than a lower log level: a level would hide the warnings that do matter from the same modules.
"""

from __future__ import annotations

import logging

_KNOWN = {
    "diffusers.models.modeling_utils": "`enable_parallelism` is an experimental feature.",
    "diffusers.hooks.context_parallel": "Expected input tensor to have 2 dimensions, but got 1 dimensions, split "
                                        "will not be applied.",
}


class KnownParallelNotice(logging.Filter):
    """Drops the one known line of its logger (``_KNOWN``)."""

    def __init__(self, known: str):
        super().__init__()
        self.known = known

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(self.known)


def install() -> None:
    """Add the filters once (a second call adds nothing)."""
    for name, known in _KNOWN.items():
        logger = logging.getLogger(name)
        if not any(isinstance(f, KnownParallelNotice) for f in logger.filters):
            logger.addFilter(KnownParallelNotice(known))
