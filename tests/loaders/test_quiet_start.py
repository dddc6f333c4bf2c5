"""No third-party warning at start (issue 30): importing diffusers' Wan I2V pipeline under transformers 5 without
torchvision logged a fallback to the PIL image processor, the one lorabind uses on purpose."""

from __future__ import annotations

import logging
import subprocess
import sys

import pytest

import lorabind.loaders  # noqa: F401  (installs the filter)

FALLBACK = ("`CLIPImageProcessor` requires torchvision (not installed); falling back to `CLIPImageProcessorPil` "
            "for backward compatibility.")


def test_only_the_known_image_processor_fallback_is_dropped(caplog):
    logger = logging.getLogger("transformers.utils.import_utils")
    with caplog.at_level(logging.WARNING, logger="transformers.utils.import_utils"):
        logger.warning(FALLBACK)
        logger.warning("`Foo` requires torchvision (not installed); install it")
    assert [record.getMessage() for record in caplog.records] == [
        "`Foo` requires torchvision (not installed); install it"]


@pytest.mark.slow  # builds tiny models / imports diffusers in a fresh process
def test_importing_the_wan_i2v_pipeline_after_lorabind_prints_nothing():
    code = "import lorabind.loaders\nfrom diffusers import WanImageToVideoPipeline\n"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "torchvision" not in done.stderr, done.stderr
