"""Prompt graph scheduling: upstream walk from the outputs, ready-node picking, lazy re-scheduling, cycles.

Mirrors ComfyUI's ``comfy_execution/graph.py`` (TopologicalSort/ExecutionList) in behaviour: only non-lazy
links (and lazy ones a node later asks for) are followed, upstream nodes whose outputs are already available
are not scheduled, and a node runs once every node it waits on has completed. Unlike ComfyUI, static cycles
are also found up front (``find_cycle``) so validation reports them instead of recursing until Python's
recursion limit.
"""

from __future__ import annotations

from typing import Callable

from .definitions import NodeDefinitions, is_link


class DependencyCycleError(Exception):
    """Nodes wait on each other; reported with ComfyUI's exception type name ``graph.DependencyCycleError``."""

    exception_type_name = "graph.DependencyCycleError"


class NodeInputError(Exception):
    """A node asked (through check_lazy_status) for an input that is absent or not a link."""


def linked_inputs(node: dict) -> list[tuple[str, str, int]]:
    """(input_name, from_node_id, from_slot) for every link input of a prompt node, sorted by input name."""
    inputs = node.get("inputs") or {}
    # links picked before sorting: most inputs are constants, and this runs for every node several times a prompt
    links = [(name, value[0], int(value[1])) for name, value in inputs.items()
             if isinstance(value, list) and is_link(value)]
    links.sort()
    return links


def upstream_closure(prompt: dict, start_ids: list[str]) -> set[str]:
    """Every node id ``start_ids`` reach through their links, themselves included (missing ids are skipped)."""
    seen, stack = set(), list(start_ids)
    while stack:
        node_id = stack.pop()
        if node_id in seen or node_id not in prompt:
            continue
        seen.add(node_id)
        stack.extend(upstream for _, upstream, _ in linked_inputs(prompt[node_id]))
    return seen


def find_cycle(prompt: dict, start_ids: list[str]) -> list[str] | None:
    """The first dependency cycle reachable upstream from ``start_ids`` (as ``[a, b, ..., a]``), else None.

    Iterative depth-first search with an explicit stack, so a long chain cannot hit the recursion limit.
    Links to node ids missing from the prompt are ignored here (validation reports them).
    """
    state: dict[str, int] = {}  # 1 = on the current path, 2 = finished
    for start in start_ids:
        if state.get(start) == 2 or start not in prompt:
            continue
        path: list[str] = [start]
        iterators = [iter(linked_inputs(prompt[start]))]
        state[start] = 1
        while iterators:
            step = next(iterators[-1], None)
            if step is None:
                state[path.pop()] = 2
                iterators.pop()
                continue
            upstream = step[1]
            if upstream not in prompt or state.get(upstream) == 2:
                continue
            if state.get(upstream) == 1:
                return path[path.index(upstream):] + [upstream]
            state[upstream] = 1
            path.append(upstream)
            iterators.append(iter(linked_inputs(prompt[upstream])))
    return None


class ExecutionList:
    """Pending nodes of one prompt run and what each still waits on.

    ``is_available(node_id)`` tells whether a node's outputs already exist (cache hit or executed earlier in
    this run); such upstream nodes are not scheduled, exactly like ComfyUI's ``is_cached`` check.
    """

    def __init__(self, prompt: dict, definitions: NodeDefinitions, is_available: Callable[[str], bool]):
        self.prompt = prompt
        self.definitions = definitions
        self.is_available = is_available
        self.pending: dict[str, bool] = {}
        self.block_count: dict[str, int] = {}
        self.blocking: dict[str, dict[str, set]] = {}  # from_node -> {to_node: {from_slots}}

    def add_node(self, node_id: str, include_lazy: bool = False) -> None:
        """Schedule ``node_id`` and, transitively, every unavailable upstream node on its non-lazy links."""
        to_visit = [node_id]
        links: list[tuple[str, int, str]] = []
        while to_visit:
            current = to_visit.pop()
            if current in self.pending:
                continue
            self.pending[current] = True
            self.block_count[current] = 0
            self.blocking[current] = {}
            lazy = () if include_lazy else self.definitions.lazy_inputs(self.prompt[current]["class_type"])
            for input_name, from_id, from_slot in linked_inputs(self.prompt[current]):
                if input_name in lazy:
                    continue
                if not self.is_available(from_id):  # links to available outputs block nothing
                    to_visit.append(from_id)
                    links.append((from_id, from_slot, current))
        for from_id, from_slot, to_id in links:
            self._add_strong_link(from_id, from_slot, to_id)

    def _add_strong_link(self, from_id: str, from_slot: int, to_id: str) -> None:
        if self.is_available(from_id):
            return
        if from_id not in self.pending:
            self.add_node(from_id)
        slots = self.blocking[from_id].setdefault(to_id, set())
        if not slots:
            self.block_count[to_id] += 1
        slots.add(from_slot)

    def make_input_strong_link(self, node_id: str, input_name: str) -> None:
        """A lazy input was requested: from now on ``node_id`` waits for the node feeding it."""
        inputs = self.prompt[node_id].get("inputs") or {}
        if input_name not in inputs:
            raise NodeInputError(
                f"Node {node_id} says it needs input {input_name}, but there is no input to that node at all"
            )
        value = inputs[input_name]
        if not is_link(value):
            raise NodeInputError(f"Node {node_id} says it needs input {input_name}, but that value is a constant")
        self._add_strong_link(value[0], int(value[1]), node_id)

    def is_empty(self) -> bool:
        return not self.pending

    def next_ready(self) -> str:
        """A node whose dependencies are all complete, preferring output nodes then their direct feeders.

        Raises DependencyCycleError when nodes are pending but none is ready.
        """
        ready = [node_id for node_id in self.pending if self.block_count[node_id] == 0]
        if not ready:
            blocked = sorted(self.pending)
            raise DependencyCycleError(f"Dependency cycle detected between nodes {', '.join(blocked)}")
        for node_id in ready:
            if self.definitions.is_output_node(self.prompt[node_id]["class_type"]):
                return node_id
        for node_id in ready:
            for to_id in self.blocking[node_id]:
                if self.definitions.is_output_node(self.prompt[to_id]["class_type"]):
                    return node_id
        return ready[0]

    def complete(self, node_id: str) -> None:
        """``node_id`` finished: unblock the nodes waiting on it."""
        del self.pending[node_id]
        for to_id in self.blocking.pop(node_id):
            self.block_count[to_id] -= 1
        del self.block_count[node_id]
