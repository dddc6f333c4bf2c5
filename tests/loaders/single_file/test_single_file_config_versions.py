"""The bundled Qwen2.5-VL configs load under transformers 4.x and 5.x alike.

transformers 5 reads the rotary settings from ``rope_parameters``; 4.x reads ``rope_scaling`` + ``rope_theta`` and
fails at the first forward without them (``self.rope_scaling["mrope_section"]`` on ``None``). Many ComfyUI
installs still run 4.x, so each config carries both spellings, and they must agree.
"""

import json

import pytest

from lorabind.loaders.io.shipped_configs import shipped_single_file_config


@pytest.mark.parametrize("name", ["qwen25_vl_tiny", "qwen25_vl_7b"])
def test_qwen25_vl_configs_spell_rope_for_both_transformers_generations(name):
    text = json.loads(shipped_single_file_config(name).read_text())["text_config"]
    v5, v4 = text["rope_parameters"], text["rope_scaling"]
    assert v4["mrope_section"] == v5["mrope_section"] and sum(v5["mrope_section"]) * 2 == (
        text["hidden_size"] // text["num_attention_heads"])
    assert text["rope_theta"] == v5["rope_theta"]
    assert v4["rope_type"] == v5["rope_type"] == "default"
