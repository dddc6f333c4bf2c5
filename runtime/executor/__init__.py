"""Headless graph executor with ComfyUI's semantics (validation, scheduling, caching, events).

Split by concern like ComfyUI's ``comfy_execution``: ``definitions`` (reading node classes), ``graph``
(scheduling, cycles), ``validation``, ``caching``, ``call_over_lists`` (calling nodes with list semantics), ``execution`` (PromptExecutor).
"""

from .execution import ExecutionResult, PromptExecutor, PromptValidationError
from .graph import DependencyCycleError
from .validation import ValidationResult, validate_prompt

__all__ = [
    "DependencyCycleError",
    "ExecutionResult",
    "PromptExecutor",
    "PromptValidationError",
    "ValidationResult",
    "validate_prompt",
]
