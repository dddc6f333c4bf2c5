"""Helpers shared by the adapter tests (a uniquely named module: conftest.py names collide across test folders)."""


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
