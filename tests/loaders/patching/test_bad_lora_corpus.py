"""The bad-input corpus for LoRA files: every hostile or broken file is refused with a LoraBindError naming it,
the model's weights stay bit-identical, and `lorabind inspect` exits 1 without a traceback.

Each case takes a valid diffusers-layout LoRA (a state dict) and breaks it one way; cases found by issue #13 are
marked so. Add a case here when a new kind of bad file turns up.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from lorabind.loaders.binding.bind import bind
from lorabind.loaders.errors import LoraBindError
from lorabind.loaders.handles import FuseSpec
from lorabind.loaders.lora import clear_lora_cache
from lorabind.runtime.cli import main
from patching_helpers import assert_bit_identical, block_modules, make_targets, snapshot, write_diffusers_lora


@pytest.fixture(autouse=True)
def _fresh_reader_cache():
    clear_lora_cache()
    yield
    clear_lora_cache()


def _rewrite_header(path, edit):
    raw = path.read_bytes()
    (length,) = struct.unpack("<Q", raw[:8])
    header = edit(raw[8:8 + length].decode())
    path.write_bytes(struct.pack("<Q", len(header)) + header.encode() + raw[8 + length:])


def _with(path, change):
    sd = load_file(str(path))
    change(sd)
    save_file(sd, str(path))


def _first(sd, suffix):
    return next(k for k in sorted(sd) if k.endswith(suffix))


def _duplicate_key(text):  # issue #13: the last of two equal keys used to win silently
    header = json.loads(text)
    key = next(k for k in header if k != "__metadata__")
    return text[:-1] + f', "{key}": ' + json.dumps(header[key]) + "}"


def _peft_folder(path, config_text):
    folder = path.parent / "adapter"
    folder.mkdir()
    sd = {"base_model.model." + k[len("transformer."):]: v for k, v in load_file(str(path)).items()}
    save_file(sd, str(folder / "adapter_model.safetensors"))
    (folder / "adapter_config.json").write_text(config_text)
    return folder


CASES = {
    "nan factor (#13)": lambda p: _with(p, lambda sd: sd[_first(sd, "lora_B.weight")].view(-1).__setitem__(0, float("nan"))),
    "inf factor (#13)": lambda p: _with(p, lambda sd: sd[_first(sd, "lora_A.weight")].view(-1).__setitem__(1, float("inf"))),
    "overflowing fuse (#13)": lambda p: _with(p, lambda sd: [t.fill_(1e19) for k, t in sd.items()
                                                              if k.endswith((".lora_A.weight", ".lora_B.weight"))]),
    "duplicate header key (#13)": lambda p: _rewrite_header(p, _duplicate_key),
    "100k nested header (#13)": lambda p: _rewrite_header(p, lambda text: "[" * 100_000),
    "truncated": lambda p: p.write_bytes(p.read_bytes()[:-7]),
    "header not json": lambda p: _rewrite_header(p, lambda text: "{" + text),
    "integer factor": lambda p: _with(p, lambda sd: sd.__setitem__(_first(sd, "lora_A.weight"),
                                                                   sd[_first(sd, "lora_A.weight")].to(torch.int32))),
    "chainless factors": lambda p: _with(p, lambda sd: sd.__setitem__(_first(sd, "lora_A.weight"), torch.ones(3, 7))),
    "pickle file": lambda p: p.rename(p.with_suffix(".ckpt")),
    "100k nested adapter_config (#13)": lambda p: _peft_folder(p, "[" * 100_000),
    "non-finite lora_alpha": lambda p: _peft_folder(p, '{"r": 4, "lora_alpha": Infinity}'),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_every_bad_file_is_refused_and_no_weight_changes(case, make_model, make_transformer, tmp_path, capsys):
    dtype = torch.bfloat16 if "overflow" in case else None
    model = make_model(dtype)
    targets = make_targets(make_transformer(), block_modules(names=("attn1.to_q", "ffn.net.2")), seed=4)
    path = Path(write_diffusers_lora(tmp_path / "bad.safetensors", targets, alpha=16.0))
    broken = CASES[case](path)
    broken = broken if isinstance(broken, Path) else path  # cases that move the file return its new path
    before = snapshot(model.components["transformer"])
    with pytest.raises(LoraBindError) as refused:
        bind(model, [FuseSpec(str(broken), 4.0, "transformer", "bad.safetensors")], [])
    assert "bad" in str(refused.value) or "adapter" in str(refused.value)
    assert_bit_identical(before, model.components["transformer"])
    if "overflow" not in case:  # a file refused on its own (the overflow needs a bf16 model to show)
        code = main(["inspect", str(broken)])
        err = capsys.readouterr().err
        assert code == 1 and "refused" in err and "Traceback" not in err
