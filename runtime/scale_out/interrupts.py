"""One small Ray actor that carries ``/interrupt`` to the replica running a prompt.

Why an actor: Ray Serve routes each call to *some* replica, so an "interrupt" call could land on the wrong one.
Instead the front marks the prompt id here and the replica running it polls its own id while it runs.
"""

from __future__ import annotations

import ray

BOARD_NAME = "lorabind-interrupts"


@ray.remote(num_cpus=0)
class InterruptBoard:
    def __init__(self):
        self._interrupted: set[str] = set()

    def interrupt(self, prompt_id: str) -> None:
        self._interrupted.add(prompt_id)

    def is_interrupted(self, prompt_id: str) -> bool:
        return prompt_id in self._interrupted

    def forget(self, prompt_id: str) -> None:
        self._interrupted.discard(prompt_id)


def interrupt_board(namespace: str):
    """The cluster's board, created on first use (named, so the front and every replica find the same one)."""
    return InterruptBoard.options(name=BOARD_NAME, namespace=namespace, get_if_exists=True,
                                  lifetime="detached").remote()
