"""The optional extras a test needs (the OpenAI client of the test extra, Ray Serve of the ray extra), asked for
without importing them while pytest collects.

Why: ``pytest.importorskip`` at module level imports the package during collection, so every run, whatever it
selects, paid for Ray Serve (0.7 s) and the OpenAI client (0.5 s) on a quiet 2-core machine, several times that
under load (issue 54). ``requires`` asks ``importlib.util.find_spec``, which finds the package without running it,
and ``deferred`` imports it on the first attribute a test reads.
"""

from __future__ import annotations

import importlib
import importlib.util

import pytest

_EXTRAS = {"openai": 'the test extra is not installed (pip install "lorabind[test]")',
           "ray": 'the scale-out extra is not installed (pip install "lorabind[ray]")'}


def requires(package: str) -> pytest.MarkDecorator:
    """Skip where the extra that brings ``package`` (a key of ``_EXTRAS``) is not installed."""
    return pytest.mark.skipif(importlib.util.find_spec(package) is None, reason=_EXTRAS[package])


class _Deferred:
    def __init__(self, name: str):
        self._name = name

    def __getattr__(self, attribute: str):
        if attribute.startswith(("_", "pytest")):  # what pytest asks of every module attribute while collecting
            raise AttributeError(attribute)
        return getattr(importlib.import_module(self._name), attribute)


def deferred(name: str) -> _Deferred:
    """The module ``name``, imported on the first attribute read: ``openai = deferred("openai")``, then
    ``openai.OpenAI`` in a test imports it."""
    return _Deferred(name)
