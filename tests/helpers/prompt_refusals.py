"""What ``serve``'s validation makes of a prompt that passed the graph checks: its early refusals (contracts, a
LoRA of another model family, an unreadable LoRA file), read from the files under a models root, no model loaded."""

from __future__ import annotations

from types import SimpleNamespace

from lorabind.runtime import folder_paths
from lorabind.runtime.core_nodes import runtime_node_classes
from lorabind.runtime.executor.validation import ValidationResult
from lorabind.runtime.server.comfy_api import prompt_service


def refused_early(prompt: dict, models_root, outputs=("8",)) -> ValidationResult:
    """``prompt_service``'s early check on ``prompt`` (its output nodes ``outputs``) with ``models_root``'s files."""
    folder_paths.configure(models_root=str(models_root))
    try:
        state = SimpleNamespace(node_classes=runtime_node_classes()[0])
        return prompt_service._refuse_contract_mismatches(
            state, ValidationResult(True, None, list(outputs), {}, prompt))
    finally:
        folder_paths.configure()
