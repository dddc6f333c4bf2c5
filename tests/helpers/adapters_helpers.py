"""Helpers shared by the adapter tests (a uniquely named module: conftest.py names collide across test folders)."""

from contextlib import contextmanager


def state_snapshot(loaded_model) -> dict:
    """Exact copy of every denoiser parameter, to assert that nothing was written."""
    return {f"{component}:{key}": value.detach().clone()
            for component, module in loaded_model.components.items()
            for key, value in module.state_dict().items()}


def assert_same_state(before: dict, loaded_model) -> None:
    after = state_snapshot(loaded_model)
    assert after.keys() == before.keys()
    changed = [key for key in before if not before[key].equal(after[key])]
    assert changed == []


@contextmanager
def recorded_forwards(loaded_model):
    """Hooks on every denoiser while the block runs; yields the list of (component, timestep) per forward."""
    calls = []
    hooks = [module.register_forward_pre_hook(
        lambda mod, args, kwargs, name=name: calls.append((name, float(kwargs["timestep"].flatten()[0]))),
        with_kwargs=True) for name, module in loaded_model.components.items()]
    try:
        yield calls
    finally:
        for hook in hooks:
            hook.remove()
