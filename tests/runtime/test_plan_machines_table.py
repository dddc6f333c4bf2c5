"""docs/model-files/real-models.md's table of `lorabind plan` answers is what `plan` answers (issue 54 item 3):
Wan2.2 T2V/I2V A14B, Wan2.1 1.3B and Qwen-Image on the machines people have, with the headroom kept free stated,
so the page cannot drift from the planner. The 12 GiB + 32 GiB answers pair GGUF denoisers (q4_k, q6_k) with the
fp8 text encoder, as ComfyUI users download them."""

from __future__ import annotations

from pathlib import Path

import pytest

import lorabind
from lorabind.loaders.placement.choices import Machine, rank_choices
from lorabind.loaders.placement.storages import decode_size

GIB = 1024**3
PAGE = Path(lorabind.__file__).parent / "docs" / "model-files" / "real-models.md"
MODELS = {"wan2.2-t2v-a14b": "Wan2.2 T2V A14B", "wan2.2-i2v-a14b": "Wan2.2 I2V A14B",
          "wan2.1-t2v-1.3b": "Wan2.1 1.3B", "qwen-image": "Qwen-Image"}
MACHINES = [(24, 64), (16, 32), (12, 32), (8, 32), (8, 16), (None, 32)]  # None: CPU only
HEADER = ("| model | machine | usable after headroom | first answer of `plan` | peak device | peak host | "
          "other storages that fit |")


def ranking(model: str, vram, ram):
    decode, source = decode_size(model, None, None)
    machine = Machine(device="cpu" if vram is None else "cuda", vram_gib=vram, ram_gib=ram, reserve_vram_gib=None,
                      decode=decode, decode_source=source)
    return rank_choices(model, machine)


def _storage(choice, fitting) -> str:
    """"q6_k" when it fits with the bf16 text encoder too, else "q6_k + fp8 encoder"."""
    with_bf16 = any(c.weights == choice.weights and c.text_encoder == "bf16" for c in fitting)
    return choice.weights if with_bf16 or choice.text_encoder == "bf16" else f"{choice.weights} + fp8 encoder"


def row(model: str, vram, ram) -> str:
    answer = ranking(model, vram, ram)
    machine = answer.machine
    where = f"CPU, {ram} GiB RAM" if vram is None else f"{vram} GiB + {ram} GiB"
    usable = (f"{machine.device_free / GIB:.1f} GiB RAM" if vram is None
              else f"{machine.device_free / GIB:.1f} + {machine.host_free / GIB:.1f} GiB")
    if not answer.fitting:
        return f"| {MODELS[model]} | {where} | {usable} | nothing fits: {answer.smallest_machine} | | | |"
    first = answer.fitting[0]
    encoder = " + fp8 encoder" if first.text_encoder == "fp8" else ""
    others = []
    for choice in answer.fitting:
        if choice.weights != first.weights and choice.weights not in [o.split()[0] for o in others]:
            others.append(_storage(choice, answer.fitting))
    host = "in RAM" if vram is None else f"{first.plan.peak_host_bytes / GIB:.1f} GiB"
    return (f"| {MODELS[model]} | {where} | {usable} | {first.weights}{encoder}, {first.plan.memory} | "
            f"{first.plan.peak_device_bytes / GIB:.1f} GiB | {host} | {', '.join(others) or '—'} |")


def table() -> list[str]:
    return [HEADER, "|---|---|---|---|---|---|---|"] + [row(m, v, r) for m in MODELS for v, r in MACHINES]


def test_the_pages_table_is_what_plan_answers():
    lines = PAGE.read_text(encoding="utf-8").splitlines()
    start = lines.index(HEADER)
    shown = lines[start:start + len(table())]
    assert shown == table()


@pytest.mark.parametrize("model", ["wan2.2-t2v-a14b", "wan2.2-i2v-a14b"])
def test_twelve_gib_and_32_gib_get_q4_k_and_q6_k_with_the_fp8_encoder(model):
    answer = ranking(model, 12, 32)
    fitting = {(c.weights, c.text_encoder) for c in answer.fitting}
    assert {("q4_k", "fp8"), ("q6_k", "fp8")} <= fitting and ("q6_k", "bf16") not in fitting
    first = answer.fitting[0]
    assert first.text_encoder == "fp8" and "text_encoders/umt5_xxl_fp8_e4m3fn_scaled.safetensors" in first.files
    # the CUDA context (0.5 GiB) and ComfyUI's Linux reserve (400 MiB) are kept free
    assert first.plan.peak_device_bytes <= answer.machine.device_free == 12 * GIB - GIB // 2 - 400 * 1024**2


def test_each_model_is_decoded_at_its_native_size():
    assert decode_size("wan2.1-t2v-1.3b", None, None)[0] == (832, 480, 81)
    assert decode_size("qwen-image", None, None)[0] == (1328, 1328, 1)
    assert decode_size("wan2.2-t2v-a14b", None, None)[0] == (1280, 720, 81)
    assert decode_size("wan2.1-t2v-1.3b", 1280, None)[0] == (1280, 736, 81)  # the other side kept to the aspect
