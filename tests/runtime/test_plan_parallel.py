"""`lorabind plan --parallel`: one rank's figures when a job splits the model (no ranks are started)."""

import json

import pytest

from lorabind.loaders.placement.headroom import host_headroom_bytes
from lorabind.runtime import cli

GIB = 1024**3


def plan_json(capsys, *arguments) -> tuple[int, dict]:
    code = cli.main(["plan", *arguments, "--json"])
    return code, json.loads(capsys.readouterr().out)


def refusal(capsys, *arguments) -> str:
    code = cli.main(["plan", *arguments])
    captured = capsys.readouterr()
    assert code == 2 and captured.out == ""
    return captured.err


def components(data: dict) -> dict:
    return {c["name"]: c["bytes"] for c in data["components"]}


def test_tp_2_halves_the_split_linears_per_rank_and_keeps_the_rest_whole(capsys):
    code, one = plan_json(capsys, "wan2.2-i2v-a14b", "--vram", "80", "--weights", "bf16")
    assert code == 0 and "parallel" not in one  # without --parallel the plan is the one-process plan, unchanged
    code, two = plan_json(capsys, "wan2.2-i2v-a14b", "--vram", "80", "--parallel", "tp=2")
    assert code == 0 and two["memory"] == "full"
    assert two["parallel"]["spec"] == {"ulysses": 1, "ring": 1, "cfg": 1, "tp": 2, "text": "tp=2"}
    assert two["parallel"]["ranks"] == 2
    whole, per_rank = components(one), components(two)
    shares = {share["component"]: share for share in two["parallel"]["tensor_parallel"]}
    assert sorted(shares) == ["transformer", "transformer_2"]
    for name, share in shares.items():
        assert share["sharded_bytes"] + share["whole_bytes"] == whole[name]
        assert share["per_rank_bytes"] == per_rank[name] == share["whole_bytes"] + share["sharded_bytes"] // 2
        # Wan 14B: 40 blocks of q, k, v, o (+ the image branch's k, v) and the FFN split; 0.5 GiB stays whole
        assert 26 * GIB < share["sharded_bytes"] < 26.5 * GIB and 0.4 * GIB < share["whole_bytes"] < 0.6 * GIB
    for name in ("text_encoder", "vae"):  # not split: the same bytes on every rank
        assert per_rank[name] == whole[name]
    # each rank reads only its shard while loading: no figure of the whole model on a rank's device
    assert "loading" not in two["parallel"] and "while loading as after" in two["reason"]


def test_tp_4_divides_wan_a14b_40_heads_and_a_degree_that_does_not_is_refused_by_name(capsys):
    code, four = plan_json(capsys, "wan2.2-i2v-a14b", "--vram", "80", "--parallel", "tp=4")
    share = four["parallel"]["tensor_parallel"][0]
    assert code == 0 and share["per_rank_bytes"] == share["whole_bytes"] + share["sharded_bytes"] // 4
    heads = refusal(capsys, "wan2.2-i2v-a14b", "--vram", "80", "--tensor-parallel-size", "3")
    assert "wan2.2_moe 'transformer'" in heads and "tp=3 must divide the denoiser's 40 attention heads" in heads
    # 5 divides the 40 heads but not the FFN's 13824 features
    width = refusal(capsys, "wan2.2-i2v-a14b", "--vram", "80", "--parallel", "tp=5")
    assert "wan2.2_moe 'transformer'" in width and "ffn" in width and "not divisible by 5" in width


@pytest.mark.parametrize("arguments, words", [
    (("minimax-h3", "--parallel", "tp=2"), ("minimax_h3", "no tensor-parallel plan")),
    (("wan2.2-i2v-a14b", "--parallel", "tp=2", "--weights", "fp8"), ("--weights fp8", "whole weight")),
    (("wan2.2-i2v-a14b", "--parallel", "tp=2", "--memory", "offload_blocks"),
     ("--memory offload_blocks", "only memory=full combines with tp")),
    (("wan2.2-i2v-a14b", "--parallel", "tp=2,ulysses=2"), ("cannot be combined with ulysses=2",)),
    (("wan2.2-i2v-a14b", "--parallel", "tp=2", "--tensor-parallel-size", "4"), ("contradicts tp=2",)),
])
def test_tp_combinations_that_cannot_work_are_refused_by_name(capsys, arguments, words):
    err = refusal(capsys, *arguments, "--vram", "80")
    assert all(word in err for word in words), err


def test_tp_fits_where_the_split_fits_since_no_rank_loads_the_whole_model(capsys):
    """After a tp=4 split Wan A14B needs 32.8 GiB per rank; each rank reads only its shard (the whole model is 64
    GiB), so 48 GiB devices fit."""
    code, data = plan_json(capsys, "wan2.2-i2v-a14b", "--vram", "48", "--parallel", "tp=4")
    assert code == 0 and data["fits"] is True and data["peak_device_bytes"] < 48 * GIB
    code, whole = plan_json(capsys, "wan2.2-i2v-a14b", "--vram", "48", "--memory", "full", "--weights", "bf16")
    assert whole["fits"] is False  # the same devices, one process: the whole model does not fit
    # the machine: nothing fits under tp=2 on 24 GiB; a sequence split of as many ranks does
    code, data = plan_json(capsys, "wan2.2-i2v-a14b", "--vram", "24", "--parallel", "tp=2", "--weights", "bf16")
    assert code == 1 and data["peak_device_bytes"] > 24 * GIB
    assert "with ulysses=2 on as many ranks (the whole model on each) memory=offload_blocks fits" in data["reason"]


def test_sequence_and_cfg_splits_keep_the_whole_model_on_every_rank(capsys):
    bf16 = ("--weights", "bf16", "--text-encoder", "bf16")
    code, one = plan_json(capsys, "wan2.2-i2v-a14b", "--vram", "24", *bf16)
    code, ulysses = plan_json(capsys, "wan2.2-i2v-a14b", "--vram", "24", "--ulysses-degree", "2", *bf16)
    code, cfg = plan_json(capsys, "wan2.2-i2v-a14b", "--vram", "24", "--parallel", "cfg=2", *bf16)
    assert components(ulysses) == components(cfg) == components(one)
    assert ulysses["memory"] == one["memory"] == "offload_blocks"  # offload plans combine with sequence splits
    assert ulysses["parallel"]["tensor_parallel"] == [] and "loading" not in ulysses["parallel"]
    # the working memory divides among the ranks sharing the tokens; a CFG rank runs one batch-1 pass as before
    assert ulysses["parallel"]["activation_bytes"] * 2 == cfg["parallel"]["activation_bytes"]


def test_a_sequence_split_searches_every_storage_with_its_files_like_plain_plan(capsys):
    """Issue 54: the README's `plan wan2.2-i2v-a14b --vram 24 --parallel ulysses=2` searched bf16 only and listed
    no files."""
    code, one = plan_json(capsys, "wan2.2-i2v-a14b", "--vram", "24", "--ram", "64")
    code_two, two = plan_json(capsys, "wan2.2-i2v-a14b", "--vram", "24", "--ram", "64", "--parallel", "ulysses=2")
    assert code == code_two == 0 and two["ranks"] == 2 and two["parallel"]["ranks"] == 2
    assert {c["weights"] for c in two["choices"]} == {c["weights"] for c in one["choices"]} >= {"fp8", "q4_k"}
    assert two["weights"] == "fp8" and two["choices"][0]["files"] and all(c["files"] for c in two["choices"])
    assert "diffusion_models/wan2.2_i2v_high_noise_14B_fp8_scaled.safetensors" in two["choices"][0]["files"]
    cli.main(["plan", "wan2.2-i2v-a14b", "--vram", "24", "--ram", "64", "--parallel", "ulysses=2"])
    out = capsys.readouterr().out
    assert "host figures per rank and checked for all 2 together" in out
    assert "GiB host per rank (27.2 GiB for 2 ranks)" in out and "     files: " in out


def test_the_ranks_share_the_machines_host_memory(capsys):
    """Two ranks on one machine each hold their own host copies: what fits one process (63.9 GiB: the offloaded
    bf16 blocks and the encoder passing through, in the 86.4 GiB left of 96) does not fit two, checked against the
    ranks together."""
    bf16 = ("--weights", "bf16", "--text-encoder", "bf16")
    code, one = plan_json(capsys, "wan2.2-i2v-a14b", "--vram", "24", "--ram", "96", *bf16)
    code_two, two = plan_json(capsys, "wan2.2-i2v-a14b", "--vram", "24", "--ram", "96", "--parallel", "ring=2", *bf16)
    assert code == 0 and one["fits"] is True and one["usable_host_bytes_per_rank"] == 96 * GIB - int(9.6 * GIB)
    assert two["usable_host_bytes_per_rank"] == one["usable_host_bytes_per_rank"] // 2
    [blocks] = [c for c in two["choices"] if c["memory"] == one["memory"] == "offload_blocks"]
    assert blocks["peak_host_bytes"] == one["peak_host_bytes"] > two["usable_host_bytes_per_rank"]
    assert code_two == 1 and two["fits"] is False
    # without --ram nothing is said to fit the host: it is said to be unchecked
    cli.main(["plan", "wan2.2-i2v-a14b", "--vram", "24", "--parallel", "ulysses=2"])
    assert "host memory: not checked (give --ram GIB to check it)" in capsys.readouterr().out


def test_text_output_names_the_spec_and_the_per_rank_split(capsys):
    assert cli.main(["plan", "wan2.2-i2v-a14b", "--vram", "80", "--ram", "128", "--parallel", "tp=2"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("parallel: tp=2 (2 ranks on one machine; the figures below are per rank, each with "
                          "59.0 GiB of the machine's --ram usable)")  # 128 GiB less 10 GiB for the OS, halved
    assert "transformer: 26.18 GiB split 2 ways, 0.50 GiB whole on every rank -> 13.58 GiB per rank" in out
    assert "memory: full  (fits)" in out


def test_the_example_in_several_gpus_is_what_plan_prints(capsys):
    import pathlib

    import lorabind

    page = (pathlib.Path(lorabind.__file__).parent / "docs" / "serving" / "several-gpus.md").read_text()
    command = "$ lorabind plan wan2.2-i2v-a14b --vram 80 --ram 128 --parallel tp=2\n"
    shown = page.split(command, 1)[1].split("\n```", 1)[0]
    assert cli.main(command.split()[2:]) == 0
    assert capsys.readouterr().out.rstrip("\n") == shown


def test_a_cpu_rank_is_planned_in_its_share_of_the_ram_with_what_stays_whole_named(capsys):
    """``--device cpu --parallel tp=2``: each rank's figure is RAM (its weights and working memory), in its share
    of ``--ram``; what every rank holds whole is named with its size (issue 58)."""
    code, data = plan_json(capsys, "wan2.1-t2v-1.3b", "--device", "cpu", "--ram", "64", "--parallel", "tp=2")
    assert code == 0 and data["parallel"]["device"] == "cpu" and data["peak_host_bytes"] == 0
    sizes = components(data)
    [share] = data["parallel"]["tensor_parallel"]
    whole = data["parallel"]["whole_on_every_rank_bytes"]
    assert whole == {"text_encoder": sizes["text_encoder"], "transformer": share["whole_bytes"], "vae": sizes["vae"]}
    assert 0.05 * GIB < share["whole_bytes"] < 0.07 * GIB  # Wan2.1-1.3B: embeddings, norms, modulation, biases
    # the rank's RAM: its components and the largest phase's working memory (a 720p decode, by default)
    assert data["peak_device_bytes"] > sum(sizes.values()) + GIB
    share_of_ram = (64 * GIB - host_headroom_bytes(64)) // 2  # the usable RAM (less the OS's headroom) halved
    assert abs(data["device_free_bytes"] - share_of_ram) <= 1 and "of RAM" in data["reason"]
    cli.main(["plan", "wan2.1-t2v-1.3b", "--device", "cpu", "--ram", "64", "--parallel", "tp=2"])
    text = capsys.readouterr().out
    assert f"each with {share_of_ram / GIB:.1f} GiB of the machine's --ram usable" in text and "peak RAM: " in text
    assert "  whole on every rank: 10.87 GiB (text_encoder 10.58, transformer 0.06, vae 0.24)" in text
    assert "give --ram GIB" in refusal(capsys, "wan2.1-t2v-1.3b", "--device", "cpu", "--parallel", "tp=2")
