"""Rank 0's validation in ``serve --parallel``: the executor's, plus what the job's split cannot run, refused
before the prompt is queued (a 400 naming the input, and under ``/v1`` the request's ``lora``) rather than failing
on every rank after the model is loaded (a 500 the ``openai`` client retries).

Today that is one thing: an unfused (PEFT) adapter under tensor parallelism (``tp``), which the binding refuses
by name at run time (``loaders/binding/sharded_deltas.py``: peft's layers are not sharded with the weights).
"""

from __future__ import annotations

from ...usecases.vocabulary import SOCKET_ADAPTER
from ..executor import PromptExecutor
from ..executor.graph import upstream_closure
from ..executor.validation import ValidationResult

UNFUSED_UNDER_TP = "unfused_adapter_under_tp"  # extra_info["lorabind_refusal"], as the prompt service's refusals
ADAPTER_INPUT = "lora_name"


class ParallelValidator:
    """``validate(prompt, targets)`` as ``PromptExecutor`` has it, for the job's ``spec``."""

    def __init__(self, node_classes: dict, spec):
        self.inner, self.spec, self.node_classes = PromptExecutor(node_classes, cache=False), spec, node_classes

    def validate(self, prompt: dict, targets=None) -> ValidationResult:
        result = self.inner.validate(prompt, targets)
        if not result.ok or self.spec.tp == 1:
            return result
        adapters = [node_id for node_id, node in result.prompt.items() if self._is_adapter(node.get("class_type"))]
        if not adapters:
            return result
        details = (f"--parallel {self.spec.describe()}: an unfused (PEFT) adapter cannot run on a tensor-parallel "
                   "model (peft's adapter layers are not sharded with the weights); fuse the LoRA instead "
                   "(FuseDistillLoRA, or --lora-backend distill), or serve without tp")
        node_errors = {node_id: {
            "errors": [_refusal(details, result.prompt[node_id]["inputs"].get(ADAPTER_INPUT))],
            "dependent_outputs": [o for o in result.outputs if node_id in upstream_closure(result.prompt, [o])],
            "class_type": result.prompt[node_id]["class_type"]} for node_id in adapters}
        error = {"type": "prompt_outputs_failed_validation", "message": "Prompt outputs failed validation",
                 "details": "\n".join(f"node {node_id}: {details}" for node_id in adapters), "extra_info": {}}
        return ValidationResult(False, error, [], node_errors, result.prompt)

    def _is_adapter(self, class_type) -> bool:
        """A node whose output is a dynamic adapter stack (what the sampler attaches unfused)."""
        return SOCKET_ADAPTER in getattr(self.node_classes.get(class_type), "RETURN_TYPES", ())


def _refusal(details: str, value) -> dict:
    """ComfyUI's node error, of the type the editor shows with its text (as the prompt service's refusals)."""
    return {"type": "exception_during_inner_validation", "message": "Value cannot run under tensor parallelism",
            "details": details, "extra_info": {"input_name": ADAPTER_INPUT, "received_value": value,
                                               "lorabind_refusal": UNFUSED_UNDER_TP}}
