"""Tensor parallelism at tp=2 on two gloo ranks (issue 42): tiny Wan2.1 (float32 and bfloat16), its VACE, a Wan2.2
I2V expert (with the image branch) and tiny Qwen-Image, each split with ``apply_tensor_parallel`` and bound with
a LoRA on its shards; and the tiny Wan2.1 folder loaded and bound through ``bind``.

The output tolerance (``OUTPUT_TOLERANCE``): float32 1e-5 absolute on outputs of order 1 (measured: 4.2e-7 Wan,
2.4e-7 Qwen-Image; 4.8e-7 / 3.6e-7 with the LoRA fused). A split changes only the order of float32 sums, in the
rowwise layers (two partial sums added by the all-reduce) and in Wan's cross-rank RMSNorm (the mean square from
two partial sums); each reordering moves a result by a few ulps (6e-8 relative), and two layers of a tiny model
compound a handful of them. Anything wrong in the split (a wrong head count, a norm over half the heads, a shard
of the wrong rows) moves the output by 1e-2 or more. bfloat16: 2^-6, two ulps of outputs below 2 (measured 2^-7:
the same reordering flips the rounding of some elements by one ulp). The fused shards and the restore are compared
bit for bit, in both dtypes (bfloat16 pairs go through the patcher's one-gemm path, fp32 through its row chunks).
"""

import pytest
import torch
from tensor_parallel_cases import CASES, run_all
from tensor_parallel_loaded import rank_part

from gloo_ranks import run_ranks

OUTPUT_TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 2.0 ** -6}

pytestmark = pytest.mark.slow

@pytest.fixture(scope="module")
def measured(tmp_path_factory) -> list:
    """Every model is split once, by two ranks in one spawn; every test reads that run's measurements."""
    from lorabind.tiny_models import build_tiny
    from lorabind.tiny_models.lora_fixtures import write_fixture_loras
    from lorabind.tiny_models.wan import WAN21_NAME, WAN22_NAME

    models_root = tmp_path_factory.mktemp("tiny_wan")
    build_tiny(models_root, names=[WAN21_NAME, WAN22_NAME])
    write_fixture_loras(models_root)
    return run_ranks(run_all, str(models_root), out_dir=tmp_path_factory.mktemp("tp2"))


@pytest.fixture(params=sorted(CASES))
def case(request, measured) -> list:
    return [ranked[request.param] for ranked in measured]


def test_split_output_matches_the_unsharded_output(case):
    for ranked in case:
        tolerance = OUTPUT_TOLERANCE[ranked["whole_output"].dtype]
        assert (ranked["split_output"] - ranked["whole_output"]).abs().max() <= tolerance
        assert (ranked["split_lora_output"] - ranked["whole_lora_output"]).abs().max() <= tolerance
        assert (ranked["whole_lora_output"] - ranked["whole_output"]).abs().max() > 1e-3  # the LoRA does act


def test_each_rank_holds_half_of_the_sharded_parameters(case):
    for ranked in case:
        count, local_bytes, full_bytes = ranked["report"]
        assert count > 0 and 2 * local_bytes == full_bytes


def test_each_fused_shard_equals_the_unsharded_fuse_bit_for_bit(case):
    placements = set()
    for rank, ranked in enumerate(case):
        for name, shard in ranked["fused"].items():
            placement = ranked["placements"][name]
            placements.add(placement)
            whole = rank_part(ranked["whole_fused"][name], placement, rank, shard)
            assert torch.equal(shard, whole), name
    assert {"(Shard(dim=0),)", "(Shard(dim=1),)", "(Replicate(),)"} <= placements  # rows, columns, rowwise bias


def test_unbinding_restores_every_shard_bit_for_bit(case):
    for ranked in case:
        assert ranked["restored"] and all(ranked["restored"].values())


def test_wan_attention_runs_half_the_heads_per_rank(case):
    heads = case[0]["heads"]
    if any(name.startswith("blocks.") for name in heads):
        assert set(heads.values()) == {1}  # the tiny Wan has 2 heads


@pytest.fixture
def refusals(measured) -> list:
    return [ranked["refusals"] for ranked in measured]


def test_cross_rank_rmsnorm_matches_the_unsharded_norm(refusals):
    # the same mean square up to the order of a float32 sum over 24 features: a few ulps of outputs up to ~10
    assert all(ranked["norm_diff"] <= 2e-6 for ranked in refusals)


def test_splitting_a_split_denoiser_again_is_refused(refusals):
    assert refusals[0]["twice"] == ("ModelLoadError: wan2.1 'transformer': --parallel tp=2: the denoiser is already "
                                    "split or parallel")


def test_a_degree_that_does_not_divide_the_heads_is_refused_by_name(refusals):
    message = refusals[0]["heads"]
    assert message.startswith("ModelLoadError: qwen_image") and "tp=2 must divide" in message and "3 attention" \
        in message


@pytest.mark.parametrize("kind", ["dora", "lokr"])
def test_a_kind_that_cannot_be_sharded_is_refused_by_name_before_writing(refusals, kind):
    for ranked in refusals:
        assert ranked[kind].startswith(f"KeyMatchError: LoRA '{kind}-file': its {kind} delta cannot be fused")
        assert ranked["shard_untouched"]
    assert "cross-rank reduction" in refusals[0]["dora"]


def test_a_peft_adapter_is_refused_under_tensor_parallelism(refusals):
    for ranked in refusals:
        assert ranked["peft"].startswith("LoraBindError: 'peft-file': unfused (PEFT) adapters cannot attach")


@pytest.fixture
def loaded(measured) -> list:
    return [ranked["loaded"] for ranked in measured]


def test_a_loaded_model_bound_through_bind_fuses_each_shard_as_the_whole_fuse(loaded):
    for ranked in loaded:
        assert ranked["fused_equal"] and all(ranked["fused_equal"].values())
        assert ranked["restored"]
    placements = set(loaded[0]["placements"].values())
    assert {"(Shard(dim=0),)", "(Shard(dim=1),)", "(Replicate(),)", "plain"} <= placements
    # the norm diffs land in the cross-rank norms' weight shards
    assert loaded[0]["placements"]["blocks.0.attn1.norm_q.weight"] == "(Shard(dim=0),)"


def test_each_rank_restores_its_shards_from_the_file_as_one_process_does(loaded):
    """Issue 60: each rank kept a RAM copy of every patched shard's original (its peak above one whole process's);
    a shard's original is now re-read as its rows or columns of the model's file, as an unsplit weight is."""
    for ranked in loaded:
        whole, split = (sources["transformer"] for sources in ranked["restore_sources"])
        assert whole["ram"] == split["ram"] == 0 and split["file"] == whole["file"] > 0
        assert 0 < split["file_bytes"] < whole["file_bytes"]  # the shards' bytes: about half
        assert ranked["restored"]  # bit for bit, through those re-reads


def test_accounting_is_of_the_whole_model_on_every_rank(loaded):
    for ranked in loaded:
        whole, split = ranked["accounting"]
        assert split == whole


def test_binding_a_peft_adapter_on_a_split_model_is_refused_by_name(loaded):
    for ranked in loaded:
        assert ranked["peft"].startswith("LoraBindError: 'style': unfused (PEFT) adapters cannot attach")


def test_the_wan22_expert_pair_samples_split_as_whole_with_loras_on_both_experts(measured):
    """Relative to the latent's size (up to 19.7 after two steps): cfg 2 takes 2·cond − uncond, tripling a
    prediction's error, and each step feeds the next; measured 2.4e-5 absolute, 1.2e-6 of the largest value."""
    for ranked in (r["denoised"] for r in measured):
        assert ranked["components"] == ["transformer", "transformer_2"]
        largest = ranked["whole"].abs().max()
        assert largest > 1.0
        assert (ranked["split"] - ranked["whole"]).abs().max() <= 1e-5 * largest
