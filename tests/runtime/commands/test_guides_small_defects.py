"""Issue 44's smaller defects: the extract no-match message lists real module names (no empty one first), and
``inspect``'s two tensor counts agree on a file whose fused tensors the family splits (MiniMax-H3's grouped qkv)."""

from __future__ import annotations

import re

import torch

from lorabind.runtime.cli import main
from patching_helpers import write_component_folder


def test_the_extract_no_match_message_names_no_empty_module(tmp_path, capsys):
    state = {"scale_shift_table": torch.randn(2, 8), "blocks.0.attn.to_q.weight": torch.randn(8, 8)}
    write_component_folder(tmp_path, "base", state)
    write_component_folder(tmp_path, "tuned", {key: value + 1 for key, value in state.items()})
    assert main(["extract", "--base", str(tmp_path / "base"), "--tuned", str(tmp_path / "tuned"), "--out",
                 str(tmp_path / "out.safetensors"), "--layers", "nothing.*"]) == 1
    err = capsys.readouterr().err
    assert "(its modules are named like blocks.0.attn.to_q)" in err and "like ," not in err


def test_inspect_counts_each_file_tensor_once_in_both_counts(tmp_path, capsys):
    from lorabind.tiny_models.minimax_h3 import NATIVE_FIXTURE_NAME, write_minimax_fixture_loras

    native = next(path for path in write_minimax_fixture_loras(tmp_path) if path.name == NATIVE_FIXTURE_NAME)
    assert main(["inspect", str(native)]) == 0
    out = capsys.readouterr().out
    total = int(re.search(r"tensors:\s+(\d+) in all", out)[1])
    by_kind = sum(int(n) for n in re.findall(r"kind:\s+\S+: \d+ modules, (\d+) tensors", out))
    assert total == by_kind > 0
