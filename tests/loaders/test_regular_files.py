"""``io.regular_files`` and ``json_limits.load_file``: the one way a model's files are opened (issue 52)."""

from __future__ import annotations

import os

import pytest

from hostile_files import write_special_file
from lorabind.loaders.io import json_limits
from lorabind.loaders.io.regular_files import (
    FileTooLargeError,
    NotRegularFileError,
    check_model_folder,
    read_bounded,
)


def test_open_regular_refuses_without_waiting_and_reads_within_the_budget(tmp_path):
    write_special_file(tmp_path / "fifo", "fifo")
    write_special_file(tmp_path / "zero", "dev-zero")
    write_special_file(tmp_path / "huge", "huge")
    (tmp_path / "small.json").write_text('{"a": 1}')
    with pytest.raises(NotRegularFileError, match="fifo is a FIFO, not a regular file"):
        read_bounded(tmp_path / "fifo", 10)
    with pytest.raises(NotRegularFileError, match="zero is a character device"):
        read_bounded(tmp_path / "zero", 10)
    with pytest.raises(NotRegularFileError, match="is a folder"):
        read_bounded(tmp_path, 10)
    with pytest.raises(FileTooLargeError, match="more than 1024 bytes"):
        read_bounded(tmp_path / "huge", 1024)
    assert json_limits.load_file(tmp_path / "small.json") == {"a": 1}
    with pytest.raises(FileTooLargeError):
        json_limits.load_file(tmp_path / "small.json", max_bytes=4)
    (tmp_path / "latin.json").write_bytes(b'{"a": "\xe9"}')
    with pytest.raises(json_limits.json.JSONDecodeError, match="not UTF-8"):
        json_limits.load_file(tmp_path / "latin.json")


def test_a_model_folder_check_names_the_special_or_oversized_entry(tmp_path):
    (tmp_path / "vae").mkdir()
    (tmp_path / "vae" / "config.json").write_text("{}")
    (tmp_path / "vae" / "weights.safetensors").write_bytes(b"x")
    (tmp_path / "notes").mkdir()  # not a component: not looked into
    os.mkfifo(tmp_path / "notes" / "fifo")
    check_model_folder(tmp_path, ["vae"])
    write_special_file(tmp_path / "vae" / "tokenizer.json", "huge")
    with pytest.raises(FileTooLargeError, match="vae/tokenizer.json holds 10737418240 bytes"):
        check_model_folder(tmp_path, ["vae"])
    os.unlink(tmp_path / "vae" / "tokenizer.json")
    write_special_file(tmp_path / "vae" / "diffusion_pytorch_model.safetensors", "dev-zero")
    with pytest.raises(NotRegularFileError, match="vae/diffusion_pytorch_model.safetensors is a character device"):
        check_model_folder(tmp_path, ["vae"])
