"""PromptExecutor: ComfyUI events, caching by signature, lazy inputs, lists, hidden inputs, interrupt, errors."""

from __future__ import annotations

import pytest

from lorabind.runtime.executor import PromptExecutor, PromptValidationError
from runtime_fake_nodes import FAKE_NODES, RtDouble


class Recorder:
    def __init__(self, on=None):
        self.events: list[tuple[str, dict]] = []
        self.on = on

    def __call__(self, name, data):
        self.events.append((name, data))
        if self.on is not None:
            self.on(name, data)

    def names(self):
        return [name for name, _ in self.events]

    def of(self, name):
        return [data for event, data in self.events if event == name]


def chain_prompt(seed=3, value=2):
    """1 RtInt -> 2 RtSeeded(seed) -> 3 RtShow ; 4 RtInt -> 5 RtShow (independent of the seed)."""
    return {
        "1": {"class_type": "RtInt", "inputs": {"value": value}},
        "2": {"class_type": "RtSeeded", "inputs": {"base": ["1", 0], "seed": seed, "mode": "add",
                                                   "style": "plain", "scale": 1.0}},
        "3": {"class_type": "RtShow", "inputs": {"value": ["2", 0]}},
        "4": {"class_type": "RtInt", "inputs": {"value": 9}},
        "5": {"class_type": "RtShow", "inputs": {"value": ["4", 0]}},
    }


def test_events_and_outputs_have_comfyui_shapes():
    recorder = Recorder()
    result = PromptExecutor(FAKE_NODES).execute(chain_prompt(), "p1", on_event=recorder)
    assert result.success and result.error is None and not result.interrupted
    assert result.outputs == {"3": {"text": ["5"]}, "5": {"text": ["9"]}}
    assert sorted(result.executed) == ["1", "2", "3", "4", "5"]
    assert result.executed.index("1") < result.executed.index("2") < result.executed.index("3")
    names = recorder.names()
    assert names[:2] == ["execution_start", "execution_cached"]
    assert names[-2:] == ["execution_success", "executing"]
    assert recorder.events[-1][1] == {"node": None, "prompt_id": "p1"}
    start, cached = recorder.events[0][1], recorder.events[1][1]
    assert set(start) == {"prompt_id", "timestamp"} and start["prompt_id"] == "p1"
    assert cached["nodes"] == [] and cached["prompt_id"] == "p1" and isinstance(cached["timestamp"], int)
    executing = [d for d in recorder.of("executing") if d["node"] is not None]
    assert [d["node"] for d in executing] == result.executed
    assert executing[0] == {"node": executing[0]["node"], "display_node": executing[0]["node"], "prompt_id": "p1"}
    assert recorder.of("executed") == [
        {"node": node, "display_node": node, "output": result.outputs[node], "prompt_id": "p1"}
        for node in result.executed if node in ("3", "5")]
    assert [m[0] for m in result.messages] == ["execution_start", "execution_cached", "execution_success"]
    assert result.meta["3"] == {"node_id": "3", "display_node": "3", "parent_node": None, "real_node_id": "3"}


def test_second_run_executes_only_nodes_downstream_of_the_change():
    executor = PromptExecutor(FAKE_NODES)
    first = executor.execute(chain_prompt(seed=3), "a")
    assert first.outputs["3"] == {"text": ["5"]}
    recorder = Recorder()
    second = executor.execute(chain_prompt(seed=4), "b", on_event=recorder)
    assert second.executed == ["2", "3"]
    assert sorted(second.cached) == ["1", "4", "5"]
    assert recorder.of("execution_cached")[0]["nodes"] == second.cached
    assert second.outputs == {"3": {"text": ["6"]}, "5": {"text": ["9"]}}
    # the cached output node replays its UI without running
    assert {"node": "5", "display_node": "5", "output": {"text": ["9"]}, "prompt_id": "b"} in recorder.of("executed")
    third = executor.execute(chain_prompt(seed=4), "c")
    assert third.executed == [] and sorted(third.cached) == ["1", "2", "3", "4", "5"]
    assert third.outputs == second.outputs
    executor.reset_cache()
    assert sorted(executor.execute(chain_prompt(seed=4), "d").executed) == ["1", "2", "3", "4", "5"]


def test_identical_subgraphs_under_other_ids_reuse_outputs():
    executor = PromptExecutor(FAKE_NODES)
    executor.execute(chain_prompt(), "a")
    renamed = {f"x{node_id}": {**node, "inputs": {k: [f"x{v[0]}", v[1]] if isinstance(v, list) else v
                                                  for k, v in node["inputs"].items()}}
               for node_id, node in chain_prompt().items()}
    result = executor.execute(renamed, "b")
    assert result.executed == [] and result.outputs["x3"] == {"text": ["5"]}


def test_is_changed_nan_and_instances_persist_per_node():
    executor = PromptExecutor(FAKE_NODES)
    prompt = {"1": {"class_type": "RtInt", "inputs": {"value": 1}},
              "2": {"class_type": "RtCounter", "inputs": {"value": ["1", 0]}},
              "3": {"class_type": "RtShow", "inputs": {"value": ["2", 0]}}}
    outputs = [executor.execute(prompt, f"p{i}").outputs["3"]["text"] for i in range(3)]
    assert outputs == [["1"], ["2"], ["3"]]  # same instance each time: its counter keeps going
    assert executor.execute(prompt, "p3").executed == ["2", "3"]


def test_lazy_inputs_evaluate_only_the_requested_branch():
    executor = PromptExecutor(FAKE_NODES)
    prompt = {"1": {"class_type": "RtInt", "inputs": {"value": 10}},
              "2": {"class_type": "RtInt", "inputs": {"value": 20}},
              "3": {"class_type": "RtLazySwitch", "inputs": {"use_first": False, "first": ["1", 0],
                                                             "second": ["2", 0]}},
              "4": {"class_type": "RtShow", "inputs": {"value": ["3", 0]}}}
    result = executor.execute(prompt, "lazy")
    assert result.outputs["4"] == {"text": ["20"]}
    assert "1" not in result.executed and result.executed.index("2") < result.executed.index("3")
    prompt["3"]["inputs"]["use_first"] = True
    result = executor.execute(prompt, "lazy2")
    assert result.outputs["4"] == {"text": ["10"]}
    assert result.executed == ["1", "3", "4"]


def test_output_and_input_is_list():
    RtDouble.calls = 0
    prompt = {"1": {"class_type": "RtRange", "inputs": {"count": 3}},
              "2": {"class_type": "RtDouble", "inputs": {"value": ["1", 0]}},
              "3": {"class_type": "RtSum", "inputs": {"values": ["2", 0]}},
              "4": {"class_type": "RtShow", "inputs": {"value": ["3", 0]}},
              "5": {"class_type": "RtShow", "inputs": {"value": ["2", 0]}}}
    result = PromptExecutor(FAKE_NODES).execute(prompt, "lists")
    assert RtDouble.calls == 3
    assert result.outputs["4"] == {"text": [str(sum(2 * i for i in (1, 2, 3)))]}
    assert result.outputs["5"] == {"text": ["2", "4", "6"]}  # one call per item, UI lists merged


def test_hidden_inputs_and_unique_id_keeps_nodes_apart():
    prompt = {"1": {"class_type": "RtInt", "inputs": {"value": 4}},
              "2": {"class_type": "RtHidden", "inputs": {"value": ["1", 0]}},
              "3": {"class_type": "RtHidden", "inputs": {"value": ["1", 0]}}}
    result = PromptExecutor(FAKE_NODES).execute(prompt, "h", extra_data={"extra_pnginfo": {"workflow": "w"}})
    assert result.outputs["2"] == {"seen": [{"value": 4, "unique_id": "2", "prompt_nodes": ["1", "2", "3"],
                                             "extra": {"workflow": "w"}}]}
    assert result.outputs["3"]["seen"][0]["unique_id"] == "3"
    assert sorted(result.executed) == ["1", "2", "3"]


def test_progress_events_and_interrupt_inside_a_node():
    def interrupt_at_step_two(name, data):
        if name == "progress" and data["value"] == 2:
            interrupt.set()

    import threading

    interrupt = threading.Event()
    recorder = Recorder(interrupt_at_step_two)
    prompt = {"1": {"class_type": "RtInt", "inputs": {"value": 1}},
              "2": {"class_type": "RtSteps", "inputs": {"value": ["1", 0], "steps": 5}},
              "3": {"class_type": "RtShow", "inputs": {"value": ["2", 0]}}}
    result = PromptExecutor(FAKE_NODES).execute(prompt, "int", on_event=recorder, interrupt_event=interrupt)
    assert not result.success and result.interrupted and result.error is None
    assert recorder.of("progress") == [{"value": 1, "max": 5, "prompt_id": "int", "node": "2"},
                                       {"value": 2, "max": 5, "prompt_id": "int", "node": "2"}]
    interrupted = recorder.of("execution_interrupted")
    assert len(interrupted) == 1
    assert {k: v for k, v in interrupted[0].items() if k != "timestamp"} == {
        "prompt_id": "int", "node_id": "2", "node_type": "RtSteps", "executed": ["1"]}
    assert "execution_success" not in recorder.names()
    assert recorder.events[-1] == ("executing", {"node": None, "prompt_id": "int"})


def test_interrupt_between_nodes_stops_before_the_next_node_runs():
    import threading

    interrupt = threading.Event()

    def interrupt_when_node_two_is_next(name, data):
        if name == "executing" and data["node"] == "2":
            interrupt.set()

    RtDouble.calls = 0
    prompt = {"1": {"class_type": "RtInt", "inputs": {"value": 1}},
              "2": {"class_type": "RtDouble", "inputs": {"value": ["1", 0]}},
              "3": {"class_type": "RtShow", "inputs": {"value": ["2", 0]}}}
    executor = PromptExecutor(FAKE_NODES)
    result = executor.execute(prompt, "b", on_event=Recorder(interrupt_when_node_two_is_next),
                              interrupt_event=interrupt)
    assert result.interrupted and result.executed == ["1"] and RtDouble.calls == 0
    # the flag is reset when the next prompt starts, and node 1 is served from cache
    again = executor.execute(prompt, "c", interrupt_event=interrupt)
    assert again.success and again.executed == ["2", "3"] and RtDouble.calls == 1


def test_failing_node_reports_execution_error_and_stops():
    prompt = {"1": {"class_type": "RtInt", "inputs": {"value": 5}},
              "2": {"class_type": "RtFail", "inputs": {"value": ["1", 0]}},
              "3": {"class_type": "RtShow", "inputs": {"value": ["2", 0]}}}
    recorder = Recorder()
    result = PromptExecutor(FAKE_NODES).execute(prompt, "err", on_event=recorder)
    assert not result.success and not result.interrupted and result.executed == ["1"]
    error = result.error
    assert error == recorder.of("execution_error")[0]
    assert error["node_id"] == "2" and error["node_type"] == "RtFail" and error["prompt_id"] == "err"
    assert error["exception_type"] == "ValueError"
    assert error["exception_message"] == "cannot handle value 5\n"
    assert error["current_inputs"] == {"value": [5]}
    assert error["executed"] == ["1"] and sorted(error["current_outputs"]) == ["1", "2", "3"]
    assert any("cannot handle value" in line or "raise ValueError" in line for line in error["traceback"])
    assert isinstance(error["timestamp"], int)
    assert "3" not in [d["node"] for d in recorder.of("executing")]
    assert recorder.events[-1] == ("executing", {"node": None, "prompt_id": "err"})


def test_non_tuple_return_is_a_readable_error():
    class Broken:
        @classmethod
        def INPUT_TYPES(cls):
            return {"required": {}}

        RETURN_TYPES = ("INT",)
        FUNCTION = "run"
        OUTPUT_NODE = True

        def run(self):
            return 3

    result = PromptExecutor({"Broken": Broken}).execute({"7": {"class_type": "Broken", "inputs": {}}}, "x")
    assert result.error["exception_message"].startswith(
        "Node 7 (Broken) must return a tuple of 1 value(s) matching RETURN_TYPES ['INT'], got int")


def test_execute_refuses_an_invalid_prompt_with_the_validation_result():
    cyclic = {"1": {"class_type": "RtAdd", "inputs": {"a": ["2", 0], "b": 1}},
              "2": {"class_type": "RtAdd", "inputs": {"a": ["1", 0], "b": 1}},
              "3": {"class_type": "RtShow", "inputs": {"value": ["2", 0]}}}
    with pytest.raises(PromptValidationError) as info:
        PromptExecutor(FAKE_NODES).execute(cyclic, "cyc")
    assert info.value.result.node_errors["2"]["errors"][0]["extra_info"]["exception_type"] == \
        "graph.DependencyCycleError"


def test_async_functions_and_undeclared_linked_inputs():
    class AsyncJoin:
        """Variadic: links into undeclared names are passed; undeclared constants are dropped."""

        OUTPUT_NODE = True

        @classmethod
        def INPUT_TYPES(cls):
            return {"required": {}}

        RETURN_TYPES = ()
        FUNCTION = "run"

        async def run(self, **kwargs):
            return {"ui": {"text": [",".join(f"{k}={v}" for k, v in sorted(kwargs.items()))]}}

    nodes = {**FAKE_NODES, "AsyncJoin": AsyncJoin}
    prompt = {"1": {"class_type": "RtInt", "inputs": {"value": 3}},
              "2": {"class_type": "RtInt", "inputs": {"value": 4}},
              "3": {"class_type": "AsyncJoin", "inputs": {"x_1": ["1", 0], "x_2": ["2", 0], "ignored": 9}}}
    result = PromptExecutor(nodes).execute(prompt, "async")
    assert result.outputs["3"] == {"text": ["x_1=3,x_2=4"]}


def test_a_prompt_without_an_interrupt_event_starts_clear_after_one_that_was_interrupted():
    """Callers that pass no interrupt_event share the executor's own flag: every prompt must clear it first."""
    from lorabind.runtime.context import current_context

    def interrupt_at_step_two(name, data):
        if name == "progress" and data["value"] == 2:
            current_context().interrupt_event.set()

    prompt = {"1": {"class_type": "RtInt", "inputs": {"value": 1}},
              "2": {"class_type": "RtSteps", "inputs": {"value": ["1", 0], "steps": 5}},
              "3": {"class_type": "RtShow", "inputs": {"value": ["2", 0]}}}
    executor = PromptExecutor(FAKE_NODES)
    first = executor.execute(prompt, "a", on_event=Recorder(interrupt_at_step_two))
    assert first.interrupted and first.executed == ["1"]
    second = executor.execute(prompt, "b")
    assert second.success and second.executed == ["2", "3"] and second.outputs == {"3": {"text": ["6"]}}
