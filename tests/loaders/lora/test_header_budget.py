"""Issue 31: LoRA headers are read under ``check_header_budget`` (bytes, tensors, nesting depth) before they
are parsed. Hostile files are generated here; the 90 MB header is a sparse file of which at most the budget is
read."""

from __future__ import annotations

import json
import struct

import pytest
import torch
from safetensors.torch import save_file

from hostile_files import write_huge_header, write_many_tensors
from lorabind.loaders.errors import LoraFileError
from lorabind.loaders.io import json_limits
from lorabind.loaders.lora.safetensors_header import read_header


def test_a_90_mb_header_is_refused_before_it_is_read(tmp_path, monkeypatch):
    path = tmp_path / "huge.safetensors"
    write_huge_header(path)
    monkeypatch.setattr(json_limits, "loads", lambda *a, **k: pytest.fail("the header was parsed"))
    with pytest.raises(LoraFileError, match=r"^huge.safetensors: safetensors header is over the 33554432-byte budget"):
        read_header(str(path), "huge.safetensors")


def test_a_header_with_too_many_tensors_is_refused_before_it_is_parsed(tmp_path, monkeypatch):
    path = tmp_path / "many.safetensors"
    write_many_tensors(path)
    monkeypatch.setattr(json_limits, "loads", lambda *a, **k: pytest.fail("the header was parsed"))
    with pytest.raises(LoraFileError, match=r"^many.safetensors: safetensors header lists 100001 tensors, over"):
        read_header(str(path), "many.safetensors")


def test_a_header_nested_deeper_than_the_format_is_refused(tmp_path):
    header = json.dumps({"a.alpha": {"dtype": "F32", "shape": [[[1]]], "data_offsets": [0, 4]}}).encode()
    path = tmp_path / "deep.safetensors"
    path.write_bytes(struct.pack("<Q", len(header)) + header + b"\0" * 4)
    with pytest.raises(LoraFileError, match=r"^deep.safetensors: safetensors header nests deeper than the format"):
        read_header(str(path), "deep.safetensors")


def test_brackets_inside_metadata_strings_do_not_count(tmp_path):
    """kohya stores JSON inside metadata strings (ss_tag_frequency): its braces are text, not nesting."""
    path = tmp_path / "kohya.safetensors"
    tag_frequency = json.dumps({"dir": {"tag[1]": 3, "a \"quoted\" {tag}": 1}}) + "[[[[{{{{"
    save_file({"a.lora_down.weight": torch.zeros(2, 4), "a.lora_up.weight": torch.zeros(4, 2)}, str(path),
              metadata={"ss_tag_frequency": tag_frequency})
    header = read_header(str(path), "kohya.safetensors")
    assert header.metadata["ss_tag_frequency"] == tag_frequency and len(header.tensors) == 2
