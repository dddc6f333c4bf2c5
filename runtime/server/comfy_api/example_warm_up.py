"""The example templates' models, fixture LoRAs and thumbnails, prepared after ``lorabind serve`` listens.

Why in the background (issue 45): on a fresh state folder building the tiny models and rendering the thumbnails
takes minutes, and the server used to do it before listening, so the URL it printed did not answer for minutes.
Now the server listens first: ``/system_stats``, the editor and the queue answer at once, and the log (stderr and
the editor's Logs panel) says what is being built, then "ready".

A prompt's validation builds the models it names (``prompt_service``), which must not race the build here, so it
waits for ``models_built`` (a prompt is queued late, never refused for a model still being built). The worker
starts as soon as the models are built; the thumbnails come after, one at a time below the user's prompts
(issue 54: the editor's first Run waited minutes for 21 of them): each runs only while the queue is idle
(``PromptQueue.while_idle``), because a thumbnail run points the shared ``folder_paths`` output folder at a scratch
folder and uses the same models.
"""

from __future__ import annotations

import asyncio
import logging
import time

from aiohttp import web

from ...core_nodes import runtime_node_classes
from ..composition_root import STATE_KEY, ServerState
from ..config import ServerConfig
from ..example_assets import prepare_example_assets
from .template_thumbnails import render_template_thumbnails

log = logging.getLogger("lorabind.server")
_TASK_KEY = web.AppKey("lorabind_example_warm_up", asyncio.Task)


def warm_up_in_background(app: web.Application, config: ServerConfig, render_thumbnails: bool = True) -> None:
    """Prepare the examples once the app listens, then start its worker (which ``_on_startup`` leaves to us
    while ``models_built`` is clear) and log "ready"."""
    state: ServerState = app[STATE_KEY]
    state.models_built.clear()

    async def start(app: web.Application) -> None:
        app[_TASK_KEY] = asyncio.create_task(asyncio.to_thread(_warm_up, state, config, render_thumbnails))

    app.on_startup.append(start)


def _warm_up(state: ServerState, config: ServerConfig, render_thumbnails: bool) -> None:
    started = time.monotonic()
    config = config.resolved()
    try:
        prepare_example_assets(config.workflows_dir, config.models_root, config.input_dir, announce=_announce)
    except Exception as exc:  # the server still serves; prompts build what they name themselves
        log.warning("examples: preparing the example templates failed (%s: %s); prompts build what they need",
                    type(exc).__name__, exc)
    finally:
        state.models_built.set()
        state.worker.start()
    log.info("ready (examples prepared in %.0f s)", time.monotonic() - started)
    if not render_thumbnails:
        return
    try:
        render_template_thumbnails(config.workflows_dir, config.state_dir, runtime_node_classes()[0], _announce,
                                   when_idle=state.queue.while_idle)
    except Exception as exc:  # a card without its picture shows the placeholder
        log.warning("examples: rendering the template thumbnails failed (%s: %s)", type(exc).__name__, exc)


def _announce(line: str) -> None:
    log.info("examples: %s", line)
