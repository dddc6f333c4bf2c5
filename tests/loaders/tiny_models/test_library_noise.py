"""Building and loading the tiny MiniMax-H3 model prints nothing of the libraries' own: no "Writing model
shards" bar, no torch FutureWarning about ``weight_norm`` (diffusers' audio VAE uses the deprecated API)."""

from __future__ import annotations

import warnings

import pytest

from lorabind.loaders.models import compat


@pytest.mark.slow
@pytest.mark.skipif(bool(compat.unmet_requirements("minimax_h3")), reason="MiniMax-H3 needs a newer diffusers")
def test_building_and_loading_minimax_h3_is_quiet(tmp_path, capfd):
    from lorabind.loaders.models.store import load_model
    from lorabind.tiny_models import build_tiny

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        build_tiny(tmp_path, names=["tiny-minimax-h3"])
        model = load_model(str(tmp_path / "diffusers" / "tiny-minimax-h3"))
    assert model.family == "minimax_h3"
    assert [str(w.message) for w in caught if "weight_norm" in str(w.message)] == []
    err = capfd.readouterr().err
    assert "Writing model shards" not in err and "Loading" not in err and "\r" not in err


def test_the_two_known_parallel_notices_of_diffusers_are_dropped_and_no_other():
    """Issue 54: every ``--parallel`` run printed diffusers' "experimental feature" warning and "split will not
    be applied" once per rank; ``quiet_parallel`` drops those two lines only (asked of the loggers' filters, so
    whatever verbosity another test left diffusers at does not matter)."""
    import logging

    from diffusers.utils import logging as diffusers_logging

    from lorabind.loaders.distributed import quiet_parallel

    def shown(logger, message: str) -> bool:
        return bool(logger.filter(logger.makeRecord(logger.name, logging.WARNING, __file__, 0, message, (), None)))

    quiet_parallel.install()
    quiet_parallel.install()  # once is enough: no second filter
    modeling = diffusers_logging.get_logger("diffusers.models.modeling_utils")
    hooks = diffusers_logging.get_logger("diffusers.hooks.context_parallel")
    for logger in (modeling, hooks):
        assert len([f for f in logger.filters if isinstance(f, quiet_parallel.KnownParallelNotice)]) == 1
    assert not shown(modeling, "`enable_parallelism` is an experimental feature. The API may change in the future "
                               "and breaking changes may be introduced at any time without warning.")
    assert not shown(hooks, "Expected input tensor to have 2 dimensions, but got 1 dimensions, split will not be "
                            "applied.")
    assert shown(hooks, "Expected input tensor to have 4 dimensions, but got 3 dimensions, split will not be applied.")
    assert shown(modeling, "another warning of the same module")


@pytest.mark.slow  # starts two ranks
def test_a_parallel_run_prints_none_of_them(tmp_path):
    import os
    import subprocess
    import sys
    from pathlib import Path

    import lorabind

    workflow = Path(lorabind.__file__).parent / "workflows" / "api" / "wan22_lightx2v_4step.api.json"
    package_parent = str(Path(lorabind.__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [package_parent, os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, "-m", "lorabind", "run", str(workflow), "--parallel", "ulysses=2",
                           "--models", str(tmp_path / "models"), "--output", str(tmp_path / "out")],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    said = done.stdout + done.stderr
    assert done.returncode == 0, said[-3000:]
    assert "experimental feature" not in said and "split will not be applied" not in said, said[-3000:]
