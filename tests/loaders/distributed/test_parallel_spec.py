"""The ``--parallel`` spec: what parses, what the guide's flags mean, and the words of every refusal."""

from __future__ import annotations

import pytest

from lorabind.loaders.distributed.spec import ParallelSpec, ParallelSpecError, parse_parallel, with_guide_flag
from lorabind.runtime.cli import build_parser
from lorabind.runtime.parallel.options import parallel_spec, refusal


@pytest.mark.parametrize("text, expected, world", [
    ("ulysses=2", ParallelSpec(ulysses=2), 2),
    ("ring=4", ParallelSpec(ring=4), 4),
    ("cfg=2", ParallelSpec(cfg=2), 2),
    ("tp=2", ParallelSpec(tp=2), 2),
    ("ulysses=2,cfg=2", ParallelSpec(ulysses=2, cfg=2), 4),
    (" ring=2 , ulysses=2 ", ParallelSpec(ulysses=2, ring=2), 4),
])
def test_a_spec_reads_into_degrees_and_a_world_size(text, expected, world):
    spec = parse_parallel(text)
    assert spec == expected and spec.world_size == world and spec.is_parallel


def test_the_record_is_frozen_and_describes_itself():
    spec = parse_parallel("cfg=2,ulysses=2")
    with pytest.raises(AttributeError):
        spec.cfg = 1
    assert spec.describe() == "ulysses=2,cfg=2" and spec.sequence == 2
    assert ParallelSpec().describe() == "none" and not ParallelSpec().is_parallel


@pytest.mark.parametrize("text, words", [
    ("ulysses", "'ulysses' is not NAME=N"),
    ("pipeline=2", "'pipeline=2' is not NAME=N; the names are ulysses, ring, cfg, tp"),
    ("ulysses=two", "--parallel: ulysses='two' is not a whole number"),
    ("ulysses=\u0662", "--parallel: ulysses='\u0662' is not a whole number (ASCII digits 0-9)"),  # Arabic-Indic 2
    ("ulysses=1_0", "ulysses='1_0' is not a whole number"),
    ("ring=0", "--parallel: ring=0: a degree is 1 or more"),
    ("ulysses=2,ulysses=2", "ulysses is given twice"),
    ("cfg=3", "cfg=3: classifier-free guidance has 2 passes"),
    ("", "'' is not NAME=N"),
])
def test_a_bad_spec_is_refused_naming_the_flag_and_the_part(text, words):
    with pytest.raises(ParallelSpecError) as refused:
        parse_parallel(text)
    assert words in str(refused.value) and str(refused.value).startswith("--parallel")


def test_the_guide_flags_fill_the_same_record():
    args = build_parser().parse_args(["run", "wf.json", "--ulysses-degree", "2", "--cfg-parallel-size", "2"])
    assert parallel_spec(args) == parse_parallel("ulysses=2,cfg=2")
    args = build_parser().parse_args(["run", "wf.json", "--parallel", "ulysses=2", "--ulysses-degree", "2"])
    assert parallel_spec(args) == ParallelSpec(ulysses=2)  # the same degree both ways agrees


def test_a_guide_flag_that_contradicts_parallel_is_refused():
    with pytest.raises(ParallelSpecError, match="--ring-degree 4 contradicts ring=2 of --parallel"):
        with_guide_flag(parse_parallel("ring=2"), "ring", "4", "--ring-degree")
    with pytest.raises(ParallelSpecError, match="--tensor-parallel-size='x' is not a whole number"):
        with_guide_flag(ParallelSpec(), "tp", "x", "--tensor-parallel-size")


def test_tensor_parallelism_runs_alone_or_with_cfg_and_a_sequence_split_is_refused_by_name():
    args = build_parser().parse_args(["run", "wf.json", "--tensor-parallel-size", "2"])
    spec = parallel_spec(args)
    assert spec == ParallelSpec(tp=2) and refusal(spec) is None
    assert refusal(parse_parallel("tp=2,cfg=2")) is None
    refused = refusal(parse_parallel("tp=2,ulysses=2"))
    assert refused.startswith("tp=2 cannot be combined with ulysses=2: a model split by tensor parallelism takes "
                              "no sequence split") and "one parallel config per model" in refused
    assert "ring=2" in refusal(parse_parallel("tp=2,ring=2"))
    assert refusal(parse_parallel("ulysses=2,cfg=2")) is None


@pytest.mark.parametrize("text, attention, refused", [
    ("ulysses=2", "native", None),
    ("ring=2", "native", "attention=native cannot run ring sequence parallelism; use one of flash, cudnn, sage"),
    ("ring=2", "flash", None),
    ("ulysses=2", "xformers", "attention=xformers cannot run ulysses sequence parallelism"),
    ("cfg=2", "xformers", None),  # nothing split inside attention
])
def test_attention_backends_that_cannot_split_the_sequence_are_refused_by_name(text, attention, refused,
                                                                                monkeypatch):
    from lorabind.loaders.distributed import context_parallel
    from lorabind.loaders.errors import ModelLoadError

    monkeypatch.setattr(context_parallel, "session_spec", lambda: parse_parallel(text))
    if refused is None:
        context_parallel.check_attention(attention, "cuda")
        return
    with pytest.raises(ModelLoadError) as error:
        context_parallel.check_attention(attention, "cuda")
    assert f"--parallel {text}: {refused}" in str(error.value)


@pytest.mark.parametrize("attention", ["native", "flash", "cudnn", "sage"])
def test_ring_on_the_cpu_is_refused_pointing_at_ulysses_whatever_the_backend(attention, monkeypatch):
    """Issue 60, item 5: on main, ring=2 on the CPU refused native ("use one of flash, cudnn, sage") and the
    backend check then refused flash ("needs a CUDA device; usable here: native"), a circle. Now every backend is
    refused with the split itself, pointing at what runs on the CPU."""
    from lorabind.loaders.distributed import context_parallel
    from lorabind.loaders.errors import ModelLoadError

    monkeypatch.setattr(context_parallel, "session_spec", lambda: parse_parallel("ring=2"))
    with pytest.raises(ModelLoadError) as error:
        context_parallel.check_attention(attention, "cpu")
    assert str(error.value) == ("--parallel ring=2: ring= runs on CUDA devices only (its attention backends flash, "
                                "cudnn, sage need CUDA), and this job runs on cpu; there, split the sequence with "
                                "ulysses=2 instead (native attention)")
    assert context_parallel.ring_device_refusal(parse_parallel("ulysses=2"), "cpu") is None


def test_ring_on_the_cpu_is_refused_before_any_rank_starts(tmp_path, capsys):
    from lorabind.runtime.cli import main

    assert main(["run", str(tmp_path / "wf.json"), "--device", "cpu", "--parallel", "ring=2"]) == 2
    assert "ring= runs on CUDA devices only" in capsys.readouterr().err
