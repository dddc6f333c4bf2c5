"""Error types of the engine. Every message is user-facing: it names the file, key, component or field."""


class LoraBindError(Exception):
    """Base class for every error the engine raises on purpose.

    Its classes report their module as ``builtins``: ComfyUI shows an error's type as ``module.Qualname`` unless
    the module is ``builtins``, and a pack loaded by path gets a module name made of its folder path
    (``…custom_nodes/lorabind.loaders.errors.ContractError``). So the UI, history and ``lorabind run`` show
    ``ContractError``. ``__reduce__`` keeps the errors picklable despite the module name."""

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        cls.__module__ = "builtins"

    def __reduce__(self):
        return _rebuild_error, (type(self).__qualname__, self.args)


class LoraFileError(LoraBindError):
    """A LoRA/adapter file or folder cannot be read (pickle format, truncated header, bad tensors, ...)."""


class KeyMatchError(LoraBindError):
    """A LoRA's keys do not fit the model (unmatched keys, shape mismatches)."""


class ComponentUnnamedError(KeyMatchError):
    """A LoRA file goes to one of several denoisers and neither its name nor the request says which. A type of its
    own so that a host can offer its own way out (a node naming the pair node) without reading the message."""


class ContractError(LoraBindError):
    """A sampling request violates a contract declared by an artifact or a checkpoint."""


class ModelLoadError(LoraBindError):
    """A model folder cannot be loaded or is not of a supported family."""


LoraBindError.__module__ = "builtins"


def _rebuild_error(name: str, args: tuple) -> LoraBindError:
    """Unpickle an error by class name (any subclass defined anywhere in the package)."""
    classes = {cls.__qualname__: cls for cls in _all_subclasses(LoraBindError)}
    return classes.get(name, LoraBindError)(*args)


def _all_subclasses(cls) -> list:
    found = [cls]
    for sub in cls.__subclasses__():
        found.extend(_all_subclasses(sub))
    return found
