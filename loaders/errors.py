"""Error types of the engine. Every message is user-facing: it names the file, key, component or field."""


class LoraBindError(Exception):
    """Base class for every error the engine raises on purpose."""


class LoraFileError(LoraBindError):
    """A LoRA/adapter file or folder cannot be read (pickle format, truncated header, bad tensors, ...)."""


class KeyMatchError(LoraBindError):
    """A LoRA's keys do not fit the model (unmatched keys, shape mismatches)."""


class ContractError(LoraBindError):
    """A sampling request violates a contract declared by an artifact or a checkpoint."""


class ModelLoadError(LoraBindError):
    """A model folder cannot be loaded or is not of a supported family."""
