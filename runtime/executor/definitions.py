"""Read a node class's V1 declaration (INPUT_TYPES, RETURN_TYPES, flags) the way ComfyUI's executor does.

Why a separate module: validation, scheduling, caching and execution all ask the same questions ("is this
input lazy?", "which hidden inputs?", "is it an output node?"). ``INPUT_TYPES()`` may scan model folders, so
one ``NodeDefinitions`` is built per validate/execute call and memoises it per class for that call only
(a later prompt sees newly added files, like ComfyUI which calls it again for every prompt).
"""

from __future__ import annotations

import functools
import inspect
from typing import Any

from ..socket_types import parse_bool

# Widget types whose constants ComfyUI casts during validation (execution.py::validate_inputs); BOOLEAN is
# parsed strictly (see parse_bool).
CASTS = {"INT": int, "FLOAT": float, "STRING": str, "BOOLEAN": parse_bool}


def is_link(value: Any) -> bool:
    """``[node_id, slot]``: a list of length 2 holding a str and an int (ComfyUI's graph_utils.is_link)."""
    return (
        isinstance(value, list)
        and len(value) == 2
        and isinstance(value[0], str)
        and isinstance(value[1], (int, float))
        and not isinstance(value[1], bool)
    )


def full_type_name(klass: type) -> str:
    """``module.Qualname`` unless builtin, as ComfyUI reports ``exception_type``."""
    module = klass.__module__
    if module == "builtins":
        return klass.__qualname__
    return f"{module}.{klass.__qualname__}"


@functools.lru_cache(maxsize=512)
def _parameters_of(function) -> tuple[frozenset, bool]:
    try:
        signature = inspect.signature(function)
    except (TypeError, ValueError):
        return frozenset(), True
    names = frozenset(
        name
        for name, param in signature.parameters.items()
        if param.kind in (param.POSITIONAL_OR_KEYWORD, param.KEYWORD_ONLY)
    )
    has_kwargs = any(p.kind is p.VAR_KEYWORD for p in signature.parameters.values())
    return names, has_kwargs


def accepted_arguments(function) -> tuple[frozenset, bool]:
    """(named parameters, has **kwargs) of a node method, used to filter what VALIDATE_INPUTS receives.

    Remembered per function (a classmethod looked up again compares equal): ``inspect.signature`` was a tenth of
    validating a prompt, and a function's parameters never change. An unhashable callable is read every time."""
    try:
        return _parameters_of(function)
    except TypeError:
        return _parameters_of.__wrapped__(function)


_CATEGORIES = ("required", "optional", "hidden")
_UNDECLARED = (None, None, None)


class _Infos(dict):
    """Input name -> info of one class, read in one pass; an undeclared name reads as (None, None, None)."""

    def __missing__(self, name: str) -> tuple:
        return _UNDECLARED


class _PerName(dict):
    """Input infos of a class whose declaration could not be read in one pass, read per name as asked, so a
    malformed input still fails only where it is asked for."""

    def __init__(self, read_one):
        super().__init__()
        self._read_one = read_one

    def __missing__(self, name: str) -> tuple:
        info = self[name] = self._read_one(name)
        return info


def _spec_info(spec: Any, category: str) -> tuple[Any, str, dict]:
    if category == "hidden":
        return spec, category, {}
    if isinstance(spec, (list, tuple)):
        extra = spec[1] if len(spec) > 1 and isinstance(spec[1], dict) else {}
        return spec[0], category, extra
    return spec, category, {}


def _read_all_infos(declared: dict) -> dict | None:
    """Every declared input's info in one pass over the declaration (the first category naming an input wins, as
    when read per name). None when a section is not a plain dict or a spec cannot be read: such a class is read per
    name, so a malformed input still fails only where it is asked for."""
    infos = _Infos()
    for category in _CATEGORIES:
        section = declared.get(category) or {}
        if type(section) is not dict:
            return None
        for name, spec in section.items():
            if name not in infos:
                try:
                    infos[name] = _spec_info(spec, category)
                except Exception:
                    return None
    return infos


class NodeDefinitions:
    """The node classes of one run, with ``INPUT_TYPES()`` memoised per class for the duration of that run.

    ``declarations``: INPUT_TYPES() results already read (the validation memo's copies), used instead of asking the
    classes: what is read from them can then serve later runs whose classes declare the same (``take_facts_of``).
    """

    def __init__(self, node_classes: dict, declarations: dict | None = None):
        self.node_classes = node_classes
        # ``get_class(class_type)``: the class or None. The dict's own method: every step of a run asks, and a
        # method of ours would add a Python call each time.
        self.get_class = node_classes.get
        self._input_types: dict[str, dict] = dict(declarations or {})
        # per class: validation, scheduling and input gathering each ask again (class_type -> input name -> info)
        self._input_info: dict[str, dict[str, tuple]] = {}
        self._declared: dict[str, tuple[str, ...]] = {}
        self._hidden: dict[str, dict] = {}
        self._lazy: dict[str, frozenset] = {}
        self._return_types: dict[str, tuple] = {}
        self._output_node: dict[str, bool] = {}
        self._keys_on_id: dict[str, bool] = {}
        for class_type in declarations or ():  # read now: such definitions lend what they read (take_facts_of)
            self.input_infos(class_type), self.hidden_inputs(class_type), self.lazy_inputs(class_type)

    def take_facts_of(self, earlier: "NodeDefinitions") -> None:
        """Use what ``earlier`` read from its declarations (input infos, declared, hidden and lazy inputs) instead of
        reading this run's again. Only when this run's ``INPUT_TYPES()`` of each of ``earlier``'s classes equals
        ``earlier``'s declaration, and ``earlier`` must be built from declarations nobody else holds (copies), so what
        it read cannot change under it. Why: on a seed-only rerun, reading the same declarations again was a tenth
        of the runtime's own work (each table is read in one pass over a declaration, per class and run)."""
        self._input_info.update(earlier._input_info)
        self._declared.update(earlier._declared)
        self._hidden.update(earlier._hidden)
        self._lazy.update(earlier._lazy)

    def input_types(self, class_type: str) -> dict:
        if class_type not in self._input_types:
            declared = self.node_classes[class_type].INPUT_TYPES()
            self._input_types[class_type] = declared if isinstance(declared, dict) else {}
        return self._input_types[class_type]

    def input_info(self, class_type: str, input_name: str) -> tuple[Any, str | None, dict | None]:
        """(input_type, category, extra_info) of a declared input; (None, None, None) if undeclared."""
        return self.input_infos(class_type)[input_name]

    def input_infos(self, class_type: str) -> dict[str, tuple]:
        """``input_info`` of every input name of a class, for callers asking about many names: index it by name
        (``[name]``; an undeclared name gives (None, None, None)). Read in one pass, once per class and run."""
        infos = self._input_info.get(class_type)
        if infos is None:
            infos = _read_all_infos(self.input_types(class_type))
            if infos is None:
                infos = _PerName(functools.partial(self._read_input_info, class_type))
            self._input_info[class_type] = infos
        return infos

    def _read_input_info(self, class_type: str, input_name: str) -> tuple[Any, str | None, dict | None]:
        declared = self.input_types(class_type)
        for category in _CATEGORIES:
            section = declared.get(category) or {}
            if input_name in section:
                return _spec_info(section[input_name], category)
        return _UNDECLARED

    def declared_inputs(self, class_type: str) -> tuple[str, ...]:
        """Required then optional input names, in declaration order."""
        names = self._declared.get(class_type)
        if names is None:
            declared = self.input_types(class_type)
            names = self._declared[class_type] = (*(declared.get("required") or {}), *(declared.get("optional") or {}))
        return names

    def hidden_inputs(self, class_type: str) -> dict:
        """{input name: hidden kind}; one dict per class and run, which callers only read."""
        hidden = self._hidden.get(class_type)
        if hidden is None:
            hidden = self._hidden[class_type] = dict(self.input_types(class_type).get("hidden") or {})
        return hidden

    def lazy_inputs(self, class_type: str) -> frozenset:
        """Names of the inputs declared ``lazy``: the scheduler asks per node, not per link."""
        names = self._lazy.get(class_type)
        if names is None:
            infos = self.input_infos(class_type)
            names = self._lazy[class_type] = frozenset(
                name for name in self.declared_inputs(class_type) if (infos[name][2] or {}).get("lazy", False))
        return names

    def is_output_node(self, class_type: str) -> bool:
        """Read once per class and run: validation and every scheduling step ask."""
        flag = self._output_node.get(class_type)
        if flag is None:
            flag = self._output_node[class_type] = getattr(self.node_classes[class_type], "OUTPUT_NODE", False) is True
        return flag

    def return_types(self, class_type: str) -> tuple:
        """RETURN_TYPES as a tuple, once per class and run (validation asks twice per link)."""
        types = self._return_types.get(class_type)
        if types is None:
            types = self._return_types[class_type] = tuple(getattr(self.node_classes[class_type], "RETURN_TYPES", ()))
        return types

    def keys_on_node_id(self, class_type: str) -> bool:
        """Whether the node id enters the cache key: NOT_IDEMPOTENT nodes and nodes taking UNIQUE_ID (read once per
        class and run)."""
        keys_on_id = self._keys_on_id.get(class_type)
        if keys_on_id is None:
            not_idempotent = bool(getattr(self.node_classes[class_type], "NOT_IDEMPOTENT", False))
            keys_on_id = not_idempotent or "UNIQUE_ID" in self.hidden_inputs(class_type).values()
            self._keys_on_id[class_type] = keys_on_id
        return keys_on_id
