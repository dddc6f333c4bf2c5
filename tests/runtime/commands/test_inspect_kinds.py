"""`lorabind inspect` names each adapter kind of a LyCORIS LoHa, LoKr and a DoRA file: modules, tensors, ranks,
alpha (text and --json)."""

import json

import pytest
import torch
from safetensors.torch import save_file

from lorabind.runtime.cli import main

MODULES = {"blocks_0_self_attn_q": (24, 24), "blocks_1_ffn_2": (24, 32)}  # tiny Wan: (out, in)


def _randn(g, *shape):
    return torch.randn(*shape, generator=g) * 0.1


def _loha(g, pre, out, inp):
    return {f"{pre}.hada_w1_a": _randn(g, out, 4), f"{pre}.hada_w1_b": _randn(g, 4, inp),
            f"{pre}.hada_w2_a": _randn(g, out, 4), f"{pre}.hada_w2_b": _randn(g, 4, inp),
            f"{pre}.alpha": torch.tensor(2.0)}


def _lokr(g, pre, out, inp):
    return {f"{pre}.lokr_w1": _randn(g, 2, 2), f"{pre}.lokr_w2_a": _randn(g, out // 2, 3),
            f"{pre}.lokr_w2_b": _randn(g, 3, inp // 2), f"{pre}.alpha": torch.tensor(6.0)}


def _dora(g, pre, out, inp):
    return {f"{pre}.lora_down.weight": _randn(g, 8, inp), f"{pre}.lora_up.weight": _randn(g, out, 8),
            f"{pre}.alpha": torch.tensor(4.0), f"{pre}.dora_scale": torch.rand(1, inp, generator=g) + 0.5,
            f"{pre}.diff_b": _randn(g, out)}


FILES = {"loha": (_loha, {"loha": (2, 10, [4], [2.0])}),
         "lokr": (_lokr, {"lokr": (2, 8, [3], [6.0])}),
         "dora": (_dora, {"dora": (2, 8, [8], [4.0]), "diff": (2, 2, [0], [None])})}


def _write(tmp_path, name):
    make, _ = FILES[name]
    g = torch.Generator().manual_seed(0)
    sd = {}
    for module, (out, inp) in MODULES.items():
        sd.update(make(g, f"lora_unet_{module}", out, inp))
    path = tmp_path / f"{name}.safetensors"
    save_file(sd, str(path))
    return path


@pytest.mark.parametrize("name", sorted(FILES))
def test_json_names_each_kind_with_its_modules_tensors_ranks_and_alpha(tmp_path, capsys, name):
    path = _write(tmp_path, name)
    assert main(["inspect", str(path), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    _, expected = FILES[name]
    got = {kind: (item["modules"], item["tensors"], item["ranks"], item["alphas"])
           for kind, item in report["kinds"].items()}
    assert got == expected
    assert sum(item["tensors"] for item in report["kinds"].values()) == report["counts"]["total"]
    if name == "dora":
        assert report["kinds"]["dora"]["on"] == ["lora"]


def test_text_report_has_one_line_per_kind(tmp_path, capsys):
    assert main(["inspect", str(_write(tmp_path, "dora"))]) == 0
    lines = [line.strip() for line in capsys.readouterr().out.splitlines() if line.strip().startswith("kind:")]
    assert lines == ["kind:     dora on lora: 2 modules, 8 tensors, rank 8, alpha 4",
                     "kind:     diff: 2 modules, 2 tensors"]
    assert main(["inspect", str(_write(tmp_path, "loha"))]) == 0
    assert "kind:     loha: 2 modules, 10 tensors, rank 4, alpha 2" in capsys.readouterr().out
