"""Each family ships its configurations in its own package, found by name without importing the families."""

import pytest

from lorabind.loaders.families import all_families
from lorabind.loaders.io.shipped_configs import FAMILY_PACKAGES, shipped_model_folder, shipped_single_file_config


def test_every_real_configuration_a_family_lists_is_in_that_familys_package():
    for family in all_families():
        package = FAMILY_PACKAGES / type(family.layout).__module__.split(".")[-2]
        for name in family.layout.real_configs:
            folder = shipped_model_folder(name)
            assert folder is not None and folder.parent.parent.parent == package, (family.id, name)


def test_every_known_single_file_configuration_is_shipped_by_its_family():
    names = {model.config for family in all_families() for model in family.layout.known_single_files
             if not model.config.endswith(".json")}
    assert len(names) >= 20
    assert all(shipped_single_file_config(name) is not None for name in names)


@pytest.mark.parametrize("name", ["", ".", "..", "../wan/configs/models/wan2.1-t2v-1.3b", "no-such-model"])
def test_a_name_that_is_not_a_shipped_configuration_finds_nothing(name):
    assert shipped_model_folder(name) is None and shipped_single_file_config(name) is None
