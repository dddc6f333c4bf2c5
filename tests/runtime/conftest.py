"""Fixtures the command and server tests share: what ``serve``'s flags set process-wide is put back after each
test (the adapter cache's defaults, the load-worker count), and ``serve_args`` parses serve's flags alone."""

import argparse
import os

import pytest


@pytest.fixture
def cache_defaults_restored():
    from lorabind.loaders.binding import bind as binding

    yield
    binding.set_adapter_cache_defaults(max_size=binding.DEFAULT_MAX_CACHED_ADAPTERS, pinned_paths=())


@pytest.fixture
def load_workers_restored():
    before = os.environ.get("LORABIND_LOAD_WORKERS")
    yield
    if before is None:
        os.environ.pop("LORABIND_LOAD_WORKERS", None)
    else:
        os.environ["LORABIND_LOAD_WORKERS"] = before


@pytest.fixture
def serve_args():
    """``serve_args(*argv)``: serve's namespace for ``argv`` (no ``--models`` added)."""
    from lorabind.runtime.commands import serve

    def parse(*argv):
        parser = argparse.ArgumentParser()
        serve.add_arguments(parser)
        return parser.parse_args([str(arg) for arg in argv])

    return parse
