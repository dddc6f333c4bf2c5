"""Every node the pack registers declares what ComfyUI's UI shows: a tooltip on each input and output, a
description, a ``lorabind/`` category, return names, a display name. One test over the whole mapping, so a node
added later is checked without anyone listing it here."""

import pytest

import lorabind
from lorabind.nodes import _NODE_MODULES

NODE_NAMES = sorted(lorabind.NODE_CLASS_MAPPINGS)


@pytest.fixture
def every_folder_registered(registry, mm_root):
    """The registry on the tiny models root plus the MiniMax-H3 one, so every file COMBO has entries."""
    for kind in ("loras", "diffusers"):
        registry.add_model_folder_path(kind, str(mm_root / kind))
    return registry


def test_the_pack_registers_a_node_from_every_node_module():
    import importlib

    for name in _NODE_MODULES:
        module = importlib.import_module(f"lorabind.nodes.{name}")
        assert module.NODE_CLASS_MAPPINGS, f"nodes/{name}.py registers no node"
        assert set(module.NODE_CLASS_MAPPINGS) <= set(NODE_NAMES), f"nodes/{name}.py nodes missing from the pack"
    assert len(NODE_NAMES) >= len(_NODE_MODULES)


@pytest.mark.parametrize("name", NODE_NAMES)
def test_node_declares_tooltips_description_category_and_return_names(name, every_folder_registered):
    cls = lorabind.NODE_CLASS_MAPPINGS[name]
    spec = cls.INPUT_TYPES()
    assert set(spec) <= {"required", "optional", "hidden"}, f"{name}: unknown input sections {sorted(spec)}"
    for group in ("required", "optional"):
        for input_name, (input_type, *options) in spec.get(group, {}).items():
            assert options and options[0].get("tooltip"), f"{name}.{input_name} has no tooltip"
            if isinstance(input_type, list):
                assert input_type, f"{name}.{input_name} COMBO is empty"
    return_names = getattr(cls, "RETURN_NAMES", ())
    tooltips = getattr(cls, "OUTPUT_TOOLTIPS", ())
    assert len(return_names) == len(cls.RETURN_TYPES) == len(tooltips), f"{name}: outputs declared unevenly"
    assert all(return_names) and all(tooltips), f"{name}: an output has no name or tooltip"
    assert cls.RETURN_TYPES or getattr(cls, "OUTPUT_NODE", False), f"{name} has no output and is no output node"
    assert cls.CATEGORY.startswith("lorabind/"), f"{name}: category {cls.CATEGORY!r}"
    assert len(cls.DESCRIPTION) > 40, f"{name}: description too short to help"
    assert callable(getattr(cls(), cls.FUNCTION)), f"{name}.{cls.FUNCTION} is not a method"
    assert lorabind.NODE_DISPLAY_NAME_MAPPINGS.get(name), f"{name} has no display name"
