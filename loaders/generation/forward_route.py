"""Where a denoiser forward goes: straight into the module, or to the step engine that batches it with other
requests' forwards (``loaders.batching``).

Why a route and not a second sampling loop: every family's prediction already calls its denoisers through its one
forward (``FamilySampling.forward``), and everything that stays per request (noise, sigmas, guidance, scheduler
state) lives in the family's loop around it. So a request's own loop runs on its own thread exactly as it does
alone, and only the forward is handed over: the engine stacks the forwards of several requests along the batch
dimension, runs them as one, and hands each request its rows back. A thread with no route (ComfyUI, ``lorabind
run``, any library caller) runs the forward itself, as before.
"""

from __future__ import annotations

import contextvars
from typing import Any, Optional, Protocol


class ForwardRoute(Protocol):
    """What a step engine offers a request's thread."""

    def forward(self, model, component: str, inputs: dict) -> Any:
        """The denoiser ``component``'s output for ``inputs`` (this request's rows only)."""


_route: contextvars.ContextVar[Optional[ForwardRoute]] = contextvars.ContextVar("lorabind_forward_route",
                                                                               default=None)


def route_forward(model, component: str, inputs: dict) -> Any:
    """THE denoiser forward of every family: through this thread's route when it has one, else here."""
    route = _route.get()
    if route is not None:
        return route.forward(model, component, inputs)
    return direct_forward(model, component, inputs)


def direct_forward(model, component: str, inputs: dict) -> Any:
    """The forward itself: the memory plan brings ``component`` to the device first (an expert swap at the
    boundary, a component kept in its file), then the module runs."""
    placement = getattr(model, "placement", None)  # read as an attribute: placement sits above the families
    if placement is not None:
        placement.activate(component)
    return model.components[component](**inputs)


def denoise_ended(model) -> None:
    """A request's last step is done: the memory plan may take ``on_demand`` denoisers off the device. A routed
    request leaves that to the engine, which does it once no other request of the model is denoising."""
    placement = getattr(model, "placement", None)
    if placement is not None and _route.get() is None:
        placement.end_denoise()


def enter_route(route: ForwardRoute) -> contextvars.Token:
    return _route.set(route)


def leave_route(token: contextvars.Token) -> None:
    _route.reset(token)
