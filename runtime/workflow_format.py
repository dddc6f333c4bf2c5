"""Workflow JSON formats: detect API vs UI (litegraph) and convert UI -> API prompt like ComfyUI's frontend.

Why our own converter: ``lorabind run`` and the server accept the UI files users save from ComfyUI, and the
only reference implementation is the frontend's TypeScript (``graphToPrompt`` / ``ExecutableNodeDTO``). We
reproduce its rules (reference comfyui.md §5): positional ``widgets_values`` mapped through the node
definitions (with the hidden control value after ``control_after_generate`` / seed widgets, ``forceInput``
inputs skipped, defaults for widgets an older save has no value for), links resolved by input *name*,
``PrimitiveNode`` values supplied in every mode, muted nodes (mode 2, Reroutes and subgraph instances too) dropped
with the inputs that pointed at them, bypassed nodes (mode 4) passed through by type, ``Note`` / ``MarkdownNote``
ignored, subgraphs flattened into ``outer:inner`` ids (a muted or bypassed instance's inner nodes left out, each
instance with its own promoted widget values), expansion capped at ``MAX_EXPANDED_NODES``. The reference is the
frontend we serve (1.58.1): its exports of the mode cases are kept in ``tests/runtime/frontend_exports_1.58.1.json``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .node_info import node_info
from .socket_types import types_compatible
from .widget_slots import control_values_after, widget_default, widget_slots

MODE_MUTED = 2
MODE_BYPASS = 4
SUBGRAPH_INPUT_ID = -10  # litegraph's id of a subgraph's input boundary node
SUBGRAPH_OUTPUT_ID = -20  # ... and of its output boundary node
VIRTUAL_TYPES = {"Reroute", "PrimitiveNode", "Note", "MarkdownNote"}
# Nested subgraph definitions multiply: a few KB of definitions can expand to hundreds of thousands of nodes.
# No real workflow comes near these; beyond them the request is refused before any work is done.
MAX_EXPANDED_NODES = 10_000
MAX_SUBGRAPH_DEPTH = 32


class WorkflowFormatError(ValueError):
    """The JSON is neither format, or a UI workflow cannot be converted (names the node id and type)."""


def detect_format(workflow: Any) -> str:
    """``"api"`` ({node_id: {class_type, inputs}} or {"prompt": that}) or ``"ui"`` (litegraph with nodes)."""
    if isinstance(workflow, dict):
        if isinstance(workflow.get("nodes"), list):
            return "ui"
        if _is_api_prompt(workflow.get("prompt")) or _is_api_prompt(workflow):
            return "api"
    raise WorkflowFormatError(
        "Not a ComfyUI workflow: expected an API prompt ({node_id: {\"class_type\", \"inputs\"}}) or a UI "
        "workflow (an object with a \"nodes\" list)."
    )


def _is_api_prompt(value: Any) -> bool:
    return (
        isinstance(value, dict)
        and bool(value)
        and all(isinstance(node, dict) and "class_type" in node for node in value.values())
    )


def to_api_prompt(workflow: Any, node_classes: dict, display_names: dict | None = None) -> tuple[dict, str]:
    """(API prompt, detected format ``"api"`` | ``"ui"``). API input is returned as a copy."""
    kind = detect_format(workflow)
    if kind == "api":
        prompt = workflow["prompt"] if _is_api_prompt(workflow.get("prompt")) else workflow
        return {str(node_id): dict(node) for node_id, node in prompt.items()}, "api"
    _check_ui_nodes(workflow.get("nodes"), "the workflow")
    for definition in _collect_subgraphs(workflow, {}).values():
        _check_ui_nodes(definition.get("nodes"), f"subgraph {definition.get('id')!r}")
    try:
        return _UiConverter(workflow, node_classes, display_names or {}).convert(), "ui"
    except WorkflowFormatError:
        raise
    except RecursionError:  # a chain of thousands of Reroutes, or links that loop through virtual nodes
        raise WorkflowFormatError("malformed UI workflow: its links loop, or chain through too many Reroute / "
                                  "subgraph hops to follow") from None
    except (KeyError, IndexError, TypeError, ValueError) as exc:  # malformed links, slots, definitions
        raise WorkflowFormatError(f"malformed UI workflow: {type(exc).__name__}: {exc}") from exc


def _check_ui_nodes(nodes: Any, where: str) -> None:
    """Every UI node needs an ``id`` and a ``type``; say which one lacks them instead of a KeyError."""
    if not isinstance(nodes, list):
        raise WorkflowFormatError(f"{where} has no 'nodes' list")
    for index, node in enumerate(nodes):
        if not isinstance(node, dict) or "id" not in node:
            raise WorkflowFormatError(f"{where}: node #{index} has no 'id'")
        if not isinstance(node.get("type"), str):
            raise WorkflowFormatError(f"{where}: node {node['id']} has no 'type' (its node class)")


@dataclass(frozen=True)
class _Link:
    origin_id: Any
    origin_slot: int
    target_id: Any
    target_slot: int
    type: Any


@dataclass(frozen=True)
class _Ref:
    """A resolved link: output ``slot`` of emitted API node ``node_id``."""

    node_id: str
    slot: int


@dataclass(frozen=True)
class _Value:
    """A link that resolved to a widget value (PrimitiveNode, or a subgraph input's promoted widget)."""

    value: Any


_DROP = object()  # the link ends at a muted node: the frontend deletes the input entirely


@dataclass
class _Scope:
    """One graph level: the root workflow or one instance of a subgraph definition."""

    prefix: str
    nodes: dict
    links: dict
    parent: "_Scope | None" = None
    instance: dict | None = None
    definition: dict | None = None
    children: dict = field(default_factory=dict)


def _normalize_links(raw_links) -> dict:
    links = {}
    for raw in raw_links or []:
        if isinstance(raw, dict):
            links[raw["id"]] = _Link(raw["origin_id"], int(raw["origin_slot"]), raw["target_id"],
                                     int(raw["target_slot"]), raw.get("type"))
        elif isinstance(raw, (list, tuple)) and len(raw) >= 5:
            links[raw[0]] = _Link(raw[1], int(raw[2]), raw[3], int(raw[4]), raw[5] if len(raw) > 5 else None)
    return links


def _collect_subgraphs(container: dict, found: dict) -> dict:
    for definition in (container.get("definitions") or {}).get("subgraphs", []) or []:
        found[definition["id"]] = definition
        _collect_subgraphs(definition, found)
    return found


def _wrap(value: Any) -> Any:
    """Array widget values travel as ``{"__value__": [...]}``: a bare list would read as a link."""
    return {"__value__": value} if isinstance(value, list) else value


class _UiConverter:
    def __init__(self, workflow: dict, node_classes: dict, display_names: dict):
        self.workflow = workflow
        self.node_classes = node_classes
        self.display_names = display_names
        self.subgraphs = _collect_subgraphs(workflow, {})
        self.infos: dict[str, dict] = {}
        self.prompt: dict[str, dict] = {}
        self.expanded = 0  # nodes in the root and in every subgraph instance expanded so far

    def convert(self) -> dict:
        root = _Scope("", {node["id"]: node for node in self.workflow["nodes"]},
                      _normalize_links(self.workflow.get("links")))
        self._count(len(root.nodes))
        self._emit_scope(root)
        for node in self.prompt.values():  # links into nodes that were not emitted are removed
            for name, value in list(node["inputs"].items()):
                if isinstance(value, list) and len(value) == 2 and isinstance(value[0], str) \
                        and value[0] not in self.prompt:
                    del node["inputs"][name]
        return self.prompt

    def _info(self, scope: _Scope, node: dict) -> dict:
        class_type = node["type"]
        if class_type not in self.infos:
            if class_type not in self.node_classes:
                raise WorkflowFormatError(
                    f"Node {scope.prefix}{node['id']} has type '{class_type}', which is not a known node class: "
                    "its widgets_values cannot be mapped to inputs (is the node pack installed? ComfyUI's core "
                    "nodes, such as KSampler or UNETLoader, are not available headless: run such a workflow inside "
                    "ComfyUI)."
                )
            self.infos[class_type] = node_info(class_type, self.node_classes[class_type],
                                               self.display_names.get(class_type))
        return self.infos[class_type]

    def _child_scope(self, scope: _Scope, instance: dict) -> _Scope:
        if instance["id"] not in scope.children:
            definition = self.subgraphs[instance["type"]]
            depth, ancestor = 1, scope
            while ancestor.parent is not None:
                if ancestor.definition is definition:  # the frontend refuses this too (a RecursionError there)
                    raise WorkflowFormatError(f"subgraph {definition.get('name') or instance['type']!r} contains "
                                              f"itself (instance {scope.prefix}{instance['id']})")
                depth, ancestor = depth + 1, ancestor.parent
            if depth > MAX_SUBGRAPH_DEPTH:
                raise WorkflowFormatError(f"subgraphs nest more than {MAX_SUBGRAPH_DEPTH} levels deep "
                                          f"(instance {scope.prefix}{instance['id']})")
            self._count(len(definition.get("nodes") or []))
            scope.children[instance["id"]] = _Scope(
                f"{scope.prefix}{instance['id']}:", {node["id"]: node for node in definition.get("nodes", [])},
                _normalize_links(definition.get("links")), scope, instance, definition)
        return scope.children[instance["id"]]

    def _count(self, nodes: int) -> None:
        self.expanded += nodes
        if self.expanded > MAX_EXPANDED_NODES:
            raise WorkflowFormatError(f"the workflow's subgraphs expand to more than {MAX_EXPANDED_NODES} nodes")

    def _emit_scope(self, scope: _Scope) -> None:
        for node in scope.nodes.values():
            if node.get("type") in self.subgraphs:
                # frontend 1.58.1 (graphToPrompt over ExecutableNodeDTOs) exports none of a muted or bypassed
                # instance's inner nodes; links *through* a bypassed instance are rerouted (_resolve_output)
                if node.get("mode", 0) not in (MODE_MUTED, MODE_BYPASS):
                    self._emit_scope(self._child_scope(scope, node))
                continue
            if node.get("mode", 0) in (MODE_MUTED, MODE_BYPASS) or node.get("type") in VIRTUAL_TYPES:
                continue
            self._emit_node(scope, node)

    def _emit_node(self, scope: _Scope, node: dict) -> None:
        info = self._info(scope, node)
        inputs = {name: _wrap(value) for name, value in self._widget_inputs(info, node).items()}
        for slot in node.get("inputs") or []:
            if slot.get("link") is None:
                continue
            resolved = self._resolve_link(scope, slot["link"])
            if resolved is _DROP:
                inputs.pop(slot["name"], None)
            elif isinstance(resolved, _Value):
                inputs[slot["name"]] = _wrap(resolved.value)
            elif isinstance(resolved, _Ref):
                inputs[slot["name"]] = [resolved.node_id, resolved.slot]
        self.prompt[f"{scope.prefix}{node['id']}"] = {
            "inputs": inputs,
            "class_type": node["type"],
            "_meta": {"title": node.get("title") or info["display_name"]},
        }

    def _widget_inputs(self, info: dict, node: dict) -> dict:
        """Map ``widgets_values`` (a list, or a dict keyed by widget name) onto the widget inputs."""
        stored = node.get("widgets_values")
        widgets = widget_slots(info)
        if isinstance(stored, dict):
            return {name: stored[name] for name in widgets if name in stored}
        stored = stored if isinstance(stored, list) else []
        # an older save stores fewer values than the node now has widgets: the frontend keeps the widgets'
        # defaults for the rest (they are created from the node definition before the values are applied)
        return {name: stored[position] if position < len(stored) else widget_default(spec)
                for name, (position, spec) in widgets.items()}

    # -- link resolution (the frontend's resolveInput) ----------------------------------------------------
    def _resolve_link(self, scope: _Scope, link_id) -> Any:
        link = scope.links.get(link_id)
        if link is None:
            return None
        return self._resolve_output(scope, link.origin_id, link.origin_slot)

    def _resolve_output(self, scope: _Scope, origin_id, slot: int) -> Any:
        if origin_id == SUBGRAPH_INPUT_ID:
            return self._resolve_subgraph_input(scope, slot)
        node = scope.nodes.get(origin_id)
        if node is None:
            return None
        mode, node_type = node.get("mode", 0), node.get("type")
        # Frontend 1.58.1's order (ExecutableNodeDTO.resolveOutput, PrimitiveNode.applyToGraph), as its export
        # shows (tests/runtime/frontend_exports_1.58.1.json): a PrimitiveNode pushes its value into its targets in
        # every mode; a bypassed node (Reroutes and subgraph instances too) hands over a matching input; a link
        # from a muted node ends, muted Reroutes and subgraph instances included (the input is then deleted).
        if node_type == "PrimitiveNode":
            values = node.get("widgets_values") or []
            return _Value(values[0]) if values else None
        if mode == MODE_MUTED:
            return _DROP
        if node_type == "Reroute":
            inputs = node.get("inputs") or []
            return self._resolve_link(scope, inputs[0].get("link")) if inputs else None
        if mode == MODE_BYPASS:
            index = self._bypass_input_index(node, slot)
            if index is None or node["inputs"][index].get("link") is None:
                return None
            return self._resolve_link(scope, node["inputs"][index]["link"])
        if node_type in self.subgraphs:
            child = self._child_scope(scope, node)
            for link in child.links.values():
                if link.target_id == SUBGRAPH_OUTPUT_ID and link.target_slot == slot:
                    return self._resolve_output(child, link.origin_id, link.origin_slot)
            return None
        if node_type in VIRTUAL_TYPES:
            return None
        return _Ref(f"{scope.prefix}{origin_id}", slot)

    @staticmethod
    def _bypass_input_index(node: dict, out_slot: int) -> int | None:
        """Which input a bypassed node passes to its output ``out_slot`` (frontend's getBypassSlotIndex)."""
        inputs = node.get("inputs") or []
        outputs = node.get("outputs") or []
        wanted = outputs[out_slot].get("type") if out_slot < len(outputs) else None
        if wanted == "*":
            return out_slot if out_slot < len(inputs) else None
        if out_slot < len(inputs) and types_compatible(inputs[out_slot].get("type"), wanted):
            return out_slot
        for index, candidate in enumerate(inputs):
            if candidate.get("type") == wanted:
                return index
        for index, candidate in enumerate(inputs):
            if types_compatible(candidate.get("type"), wanted):
                return index
        return None

    def _resolve_subgraph_input(self, scope: _Scope, slot: int) -> Any:
        """An inner link from the subgraph's input boundary: follow the instance's input in the parent."""
        if scope.definition is None or scope.instance is None:
            return None
        declared = scope.definition.get("inputs") or []
        if slot >= len(declared):
            return None
        name = declared[slot].get("name")
        instance_inputs = scope.instance.get("inputs") or []
        match = next((i for i in instance_inputs if i.get("name") == name), None)
        if match is None and slot < len(instance_inputs):
            match = instance_inputs[slot]
        if match is not None and match.get("link") is not None:
            return self._resolve_link(scope.parent, match["link"])
        stored = scope.instance.get("widgets_values")
        if isinstance(stored, dict):
            return _Value(stored[name]) if name in stored else None
        if isinstance(stored, list):
            position = self._promoted_value_positions(scope).get(slot)
            if position is not None and position < len(stored):
                return _Value(stored[position])
        return None

    def _promoted_value_positions(self, scope: _Scope) -> dict:
        """{subgraph input slot: index in the instance's ``widgets_values``}.

        The frontend (SubgraphNode.serialize) stores one value per *promoted* input, in input order: an input
        whose first linked inner target is a widget input. The instance's own ``inputs`` cannot tell which those
        are, since the export drops unlinked widget inputs. Older saves also kept a slot for a seed's
        control_after_generate companion; like the frontend, that is assumed only when the list is longer."""
        promoted = []  # (slot, has a control companion)
        for slot, declared in enumerate(scope.definition.get("inputs") or []):
            for link_id in declared.get("linkIds") or []:
                link = scope.links.get(link_id)
                target = scope.nodes.get(link.target_id) if link is not None else None
                inputs = (target or {}).get("inputs") or []
                if link is None or link.target_slot >= len(inputs) or not inputs[link.target_slot].get("widget"):
                    continue
                promoted.append((slot, self._has_control_companion(scope, target, inputs[link.target_slot])))
                break
        extra = len(scope.instance.get("widgets_values") or []) > len(promoted)
        positions, position = {}, 0
        for slot, companion in promoted:
            positions[slot] = position
            position += 1 + (1 if extra and companion else 0)
        return positions

    def _has_control_companion(self, scope: _Scope, node: dict, socket: dict) -> bool:
        if node.get("type") not in self.node_classes:
            return False
        info = self._info(scope, node)
        name = (socket.get("widget") or {}).get("name") or socket.get("name")
        for section in ("required", "optional"):
            spec = (info["input"].get(section) or {}).get(name)
            if spec is not None:
                options = spec[1] if len(spec) > 1 and isinstance(spec[1], dict) else {}
                return control_values_after(name, spec[0], options) > 0
        return False
