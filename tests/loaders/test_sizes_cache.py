"""``plan``'s sizes cache is a file anyone may have put there (issues 52 and 61): a FIFO, a link to /dev/zero, a
huge file or a JSON with duplicate keys is ignored at once and replaced; an entry that does not verify against its
source configuration (edited, forged, padded with components the model does not have) is measured again."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from bounded_child import run_case
from lorabind.runtime import cli

MODEL, MACHINE = "wan2.1-t2v-14b", ("--vram", "8", "--ram", "32")


@pytest.fixture
def cache_dir(tmp_path, monkeypatch) -> Path:
    folder = tmp_path / "cache"
    monkeypatch.setenv("LORABIND_CACHE_DIR", str(folder))
    return folder


def _plan(capsys) -> dict:
    assert cli.main(["plan", MODEL, *MACHINE, "--json"]) in (0, 1)
    return json.loads(capsys.readouterr().out)


def _entries(cache_dir: Path) -> dict:
    return json.loads((cache_dir / "component-sizes.json").read_text())


def _rewrite(cache_dir: Path, change) -> None:
    path = cache_dir / "component-sizes.json"
    entries = json.loads(path.read_text())
    for entry in entries.values():
        change(entry)
    path.write_text(json.dumps(entries))


def _size_records(entry) -> list:
    """The size dicts of an entry, sealed (``{"seal", "value"}``) or bare, of a model (a list) or a config."""
    value = entry["value"] if isinstance(entry, dict) and "seal" in entry else entry
    return value if isinstance(value, list) else [value]


def test_an_edited_entry_does_not_verify_and_is_measured_again(cache_dir, capsys):
    """Issue 61: a poisoned entry made a 14B model "fit" in 7.9 GiB."""
    clean = _plan(capsys)

    def shrink(entry):
        for component in _size_records(entry):
            for field in ("bytes", "largest_layer_bytes", "largest_block_bytes", "blocks_bytes"):
                component[field] //= 100

    _rewrite(cache_dir, shrink)
    assert _plan(capsys) == clean
    assert _plan(capsys) == clean  # and the file holds good entries again


def test_an_entry_sealed_without_this_users_secret_is_measured_again(cache_dir, capsys):
    import hashlib

    clean = _plan(capsys)

    def forge(entry):
        for component in _size_records(entry):
            component["bytes"] = 1
        if "seal" in entry:  # a seal anyone can compute: a plain hash of the value
            entry["seal"] = hashlib.sha256(json.dumps(entry["value"]).encode()).hexdigest()

    _rewrite(cache_dir, forge)
    assert _plan(capsys) == clean


def test_an_entry_padded_with_components_the_model_lacks_is_refused(cache_dir, capsys):
    """Issue 61: a 2.4 MB cache padded with thousands of components cost 256 s of planning."""
    from lorabind.loaders.placement import sizes_cache

    clean = _plan(capsys)
    padded = [dict(name=f"vae{i}", role="vae", file_backed=True, bytes=1, largest_layer_bytes=1,
                   largest_block_bytes=1, blocks_bytes=1, parameters=1) for i in range(200)]

    def pad(entry):
        records = _size_records(entry)
        if "name" in records[0]:  # a model's entry
            records.extend(padded)

    _rewrite(cache_dir, pad)
    assert _plan(capsys) == clean
    assert not sizes_cache._valid_components(padded, frozenset(f"vae{i}" for i in range(200)))  # too many
    assert not sizes_cache._valid_components(padded[:3], frozenset({"vae", "transformer"}))  # not its index's
    assert not sizes_cache._valid_components([padded[0], padded[0]], frozenset({"vae0"}))  # twice
    assert sizes_cache._valid_components(padded[:1], frozenset({"vae0", "text_encoder"}))


def test_a_cache_others_may_write_is_ignored_and_replaced(cache_dir, capsys):
    clean = _plan(capsys)
    path = cache_dir / "component-sizes.json"
    os.chmod(path, 0o666)
    assert _plan(capsys) == clean
    assert not os.stat(path).st_mode & 0o022  # rewritten as this user's own file
    assert not os.stat(cache_dir / "component-sizes.key").st_mode & 0o077  # the secret: this user's only


_READ_CACHE = """
import os
from lorabind.loaders.placement import sizes_cache

def case():
    return len(sizes_cache._read())
"""


@pytest.mark.parametrize("kind", ["fifo", "dev-zero", "huge", "duplicate-keys"])
def test_a_cache_file_that_is_not_ours_is_ignored_at_once(tmp_path, kind):
    """Issue 52: a FIFO as the cache file hung ``plan``; a JSON with duplicate keys is no file we wrote."""
    path = tmp_path / "component-sizes.json"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "dev-zero":
        os.symlink("/dev/zero", path)
    elif kind == "huge":
        with open(path, "wb") as handle:
            handle.truncate(10 << 30)  # sparse: no disk
    else:
        path.write_text('{"a": {"seal": "x", "value": 1}, "a": {"seal": "y", "value": 2}}')
    run = run_case(_READ_CACHE, timeout=60, env={"LORABIND_CACHE_DIR": str(tmp_path)})
    assert run.outcome == "returned: 0"
    assert run.seconds < 5 and run.peak_above_mib < 300, run


def test_sizes_measured_while_a_config_changed_are_not_kept_under_the_old_configs_key(cache_dir):
    """Issue 54's audit: the key is computed from the configs as read first, and ``measure`` reads them again."""
    from lorabind.loaders.placement import sizes_cache

    key = ("k" * 64, frozenset({"vae"}))
    measured = [dict(name="vae", role="vae", file_backed=True, bytes=1, largest_layer_bytes=1,
                     largest_block_bytes=1, blocks_bytes=1, parameters=1)]
    assert sizes_cache.cached_components(key, lambda: measured, lambda: ("j" * 64, frozenset({"vae"}))) == measured
    assert sizes_cache._lookup(key[0]) is None  # changed in between: not stored
    assert sizes_cache.cached_components(key, lambda: measured, lambda: key) == measured
    assert sizes_cache._lookup(key[0]) == measured
