"""No third-party warning at start (issue 30): importing diffusers' Wan I2V pipeline under transformers 5 without
torchvision logged a fallback to the PIL image processor, the one lorabind uses on purpose."""

from __future__ import annotations

import logging
import subprocess
import sys

import pytest

from lorabind.loaders.families.wan import quiet_fallback

FALLBACK = ("`CLIPImageProcessor` requires torchvision (not installed); falling back to `CLIPImageProcessorPil` "
            "for backward compatibility.")


def test_the_engine_package_alone_installs_no_log_filter():
    code = ("import logging, lorabind.loaders\n"
            "print(len(logging.getLogger('transformers.utils.import_utils').filters))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.stdout.strip() == "0", done.stderr


def test_only_the_known_image_processor_fallback_is_dropped(caplog):
    quiet_fallback.install()
    quiet_fallback.install()  # twice: still one filter
    logger = logging.getLogger("transformers.utils.import_utils")
    assert sum(isinstance(f, quiet_fallback.KnownFallbackFilter) for f in logger.filters) == 1
    with caplog.at_level(logging.WARNING, logger="transformers.utils.import_utils"):
        logger.warning(FALLBACK)
        logger.warning("`Foo` requires torchvision (not installed); install it")
    assert [record.getMessage() for record in caplog.records] == [
        "`Foo` requires torchvision (not installed); install it"]


@pytest.mark.slow  # builds tiny models / imports diffusers in a fresh process
def test_importing_the_wan_i2v_pipeline_after_the_wan_family_prints_nothing():
    code = ("from lorabind.loaders.families import family_by_id\nfamily_by_id('wan2.1')\n"
            "from diffusers import WanImageToVideoPipeline\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "torchvision" not in done.stderr, done.stderr
