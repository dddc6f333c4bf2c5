"""Parallel shard loading: diffusers' thread pool with our worker count, only inside the block, same weights."""

import pytest
import torch

from lorabind.loaders.parallel_loading import parallel_loading_available, shard_loading

pytestmark = pytest.mark.skipif(not parallel_loading_available(), reason="diffusers without parallel loading")


def test_worker_count_applies_inside_the_block_only_and_loads_the_same_weights(tmp_path, monkeypatch):
    from diffusers import WanTransformer3DModel
    from diffusers.models import model_loading_utils, modeling_utils

    torch.manual_seed(0)
    WanTransformer3DModel(patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=8, in_channels=4,
                          out_channels=4, text_dim=8, freq_dim=16, ffn_dim=16, num_layers=4).save_pretrained(
        tmp_path, max_shard_size="8KB")
    shards = len(list(tmp_path.glob("*.safetensors")))
    pools = []
    real_pool = modeling_utils._load_shard_files_with_threadpool

    def spy(*args, **kwargs):
        pools.append(model_loading_utils.DEFAULT_HF_PARALLEL_LOADING_WORKERS)
        return real_pool(*args, **kwargs)

    monkeypatch.setattr(modeling_utils, "_load_shard_files_with_threadpool", spy)
    before = (modeling_utils.HF_ENABLE_PARALLEL_LOADING, model_loading_utils.DEFAULT_HF_PARALLEL_LOADING_WORKERS)
    with shard_loading(1) as used:
        sequential = WanTransformer3DModel.from_pretrained(str(tmp_path), torch_dtype=torch.bfloat16)
    assert used == 1 and pools == []
    with shard_loading(3) as used:
        assert modeling_utils.HF_ENABLE_PARALLEL_LOADING is True
        parallel = WanTransformer3DModel.from_pretrained(str(tmp_path), torch_dtype=torch.bfloat16)
    assert used == 3 and pools == [3] and shards > 3
    assert (modeling_utils.HF_ENABLE_PARALLEL_LOADING,
            model_loading_utils.DEFAULT_HF_PARALLEL_LOADING_WORKERS) == before
    a, b = sequential.state_dict(), parallel.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert any(t.abs().sum() > 0 for t in a.values())
