"""What ``serve --parallel`` refuses on rank 0 before queueing, and what never leaves rank 0 (issues 60 and 52).

- A per-request PEFT ``lora`` under ``tp`` is a 400 naming ``lora`` (issue 60, item 5): on main it was queued and
  failed on every rank after the model loaded, a 500 ``server_error`` with ``param: null`` that the ``openai``
  client retries. The same adapter under a sequence split is not refused (peft runs on a whole model).
- The comfy.org tokens (the queue item's sensitive part, merged into ``extra_data`` for the run) stay on rank 0
  (issue 52, item 1): what rank 0 sends the other ranks, read back from the store, holds none of them.
"""

from __future__ import annotations

import threading
from pathlib import Path

import torch.distributed as dist

import lorabind
from lorabind.loaders.distributed.spec import ParallelSpec
from lorabind.runtime.core_nodes import runtime_node_classes
from lorabind.runtime.executor.execution import ExecutionResult
from lorabind.runtime.parallel.job_store import JobStore
from lorabind.runtime.parallel.prompt_channel import PromptChannel
from lorabind.runtime.server.history import SENSITIVE_EXTRA_DATA_KEYS
from lorabind.runtime.server.openai.jobs import validation_error
from lorabind.runtime.server.openai.requests import parse_images
from lorabind.runtime.server.openai.templates import fill_in, load_template
from lorabind.runtime.server.parallel_job import RankZeroExecutor
from lorabind.runtime.server.parallel_validation import ParallelValidator

WORKFLOWS = Path(lorabind.__file__).parent / "workflows" / "api"
NODE_CLASSES = runtime_node_classes()[0]
ADAPTER = "lorabind-tiny/Qwen-Image-Lightning-4steps-V1.0.safetensors"


def _with_adapter(registry_at, tiny_models_root):
    registry_at(tiny_models_root)
    template = load_template("qwen-image", str(WORKFLOWS / "qwen_image_lightning.api.json"), NODE_CLASSES)
    request = parse_images({"prompt": "a dog", "size": "32x32", "lora": {"path": ADAPTER, "scale": 0.5}},
                           {"qwen-image": template})
    return template, fill_in(template, request.values, request.adapters), request.sent


def test_a_request_adapter_under_tp_is_a_400_naming_lora(registry_at, tiny_models_root):
    template, prompt, sent = _with_adapter(registry_at, tiny_models_root)
    result = ParallelValidator(NODE_CLASSES, ParallelSpec(tp=2)).validate(prompt)
    assert not result.ok
    refusal = validation_error(template, prompt, result, sent)
    assert (refusal.status, refusal.param) == (400, "lora")
    assert "--parallel tp=2: an unfused (PEFT) adapter cannot run on a tensor-parallel model" in refusal.message
    assert "fuse the LoRA instead" in refusal.message


def test_a_request_adapter_under_a_sequence_split_is_not_refused(registry_at, tiny_models_root):
    _, prompt, _ = _with_adapter(registry_at, tiny_models_root)
    assert ParallelValidator(NODE_CLASSES, ParallelSpec(ulysses=2)).validate(prompt).ok


class _Local:
    """A rank 0 executor that succeeds at once (no node runs: what is sent is the point)."""

    concurrency = 1

    def slot(self):
        return 0

    def execute(self, *args, **kwargs):
        return ExecutionResult(success=True)

    def reset_cache(self):
        pass


class _RecordingStore:
    """A HashStore that keeps every value ever written to it (rank 0 deletes a prompt's keys when it ends)."""

    def __init__(self):
        self.store, self.written = dist.HashStore(), []

    def set(self, key, value):
        self.written.append(value if isinstance(value, bytes) else str(value).encode())
        self.store.set(key, value)

    def __getattr__(self, name):
        return getattr(self.store, name)


class _Ranks:
    """A job of one rank (no peer to wait for) over a recording store."""

    can_restart = True

    def __init__(self):
        self.store = _RecordingStore()
        self.channel = PromptChannel(JobStore(self.store, b"the job's secret for this test"), 0, 1, 5.0)

    def lost(self):
        return None


def test_no_comfy_org_token_leaves_rank_0(tmp_path):
    ranks = _Ranks()
    executor = RankZeroExecutor(_Local(), ranks)
    tokens = {"auth_token_comfy_org": "the user's comfy.org token", "api_key_comfy_org": "the user's API key"}
    assert set(tokens) == set(SENSITIVE_EXTRA_DATA_KEYS)
    result = executor.execute({"1": {"class_type": "X", "inputs": {}}}, "p-1",
                              {"client_id": "c", **tokens}, None, threading.Event(), ["1"])
    assert result.success
    sent = b"".join(ranks.store.written)
    assert b'"client_id": "c"' in sent and b'"prompt_id": "p-1"' in sent  # the prompt did go out
    assert not any(token.encode() in sent for token in tokens.values())
