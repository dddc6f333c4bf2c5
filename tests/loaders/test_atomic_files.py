"""Outputs are written whole or not at all, with the mode a plain open() gives."""

import os
import stat

import pytest

from lorabind.loaders.io.atomic_files import write_atomically


def test_written_file_gets_the_umask_mode_and_no_temp_is_left(tmp_path):
    target = tmp_path / "out.bin"
    write_atomically(str(target), lambda temp: open(temp, "wb").write(b"data"))
    assert target.read_bytes() == b"data"
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE(target.stat().st_mode) == 0o666 & ~umask
    assert [p.name for p in tmp_path.iterdir()] == ["out.bin"]


def test_a_failing_writer_leaves_the_old_file_and_no_temp(tmp_path):
    target = tmp_path / "out.bin"
    target.write_bytes(b"old")

    def fail(temp):
        open(temp, "wb").write(b"half")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        write_atomically(str(target), fail)
    assert target.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["out.bin"]
