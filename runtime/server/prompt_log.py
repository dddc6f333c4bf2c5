"""One log line per prompt event on the server (queued or refused, started, finished / failed / interrupted), so a person
running ``lorabind serve`` sees what happens without a client: the failing node and error, and what the sampler
bound (fuses, adapters, model parameters written)."""

from __future__ import annotations

import logging

log = logging.getLogger("lorabind.server")


def queued(prompt_id: str, number, node_count: int, client_id: str | None, behind: str | None = None) -> None:
    """``behind``: the server's background work the prompt waits for (``PromptQueue.background``)."""
    client = f", client {client_id}" if client_id else ""
    waits = f"; it runs when the {behind} in progress is done (a few seconds)" if behind else ""
    log.info("prompt %s queued (#%g, %d node%s%s)%s", prompt_id, number, node_count, "" if node_count == 1 else "s",
             client, waits)


MAX_REFUSAL_NODES = 3  # a refusal line names this many nodes' errors, then how many more there are


def refused(prompt_id: str | None, error: dict, node_errors: dict | None = None, client_id: str | None = None) -> None:
    """A prompt answered 400 (not queued): ComfyUI's error and each refused node's first error, on one line, so
    the log has a line for every prompt sent, not only for those that ran."""
    client = f" (client {client_id})" if client_id else ""
    summary = _one_line(error)
    words = [f"prompt {prompt_id or '(no id)'} refused{client}: {summary}"]
    nodes = list((node_errors or {}).items())
    for node_id, entry in nodes[:MAX_REFUSAL_NODES]:
        first = (entry.get("errors") or [{}])[0] if isinstance(entry, dict) else {}
        details = " ".join(str(first.get("details") or "").split()) if isinstance(first, dict) else ""
        # the early checks put each node's sentence in the error's details too: said once, with the node's class
        said = f"node {node_id}: {details}" in summary if details else False
        words.append(f"node {node_id} ({entry.get('class_type', '?')}): "
                     + (str(first.get("message") or "") if said else _one_line(first)))
    if len(nodes) > MAX_REFUSAL_NODES:
        words.append(f"{len(nodes) - MAX_REFUSAL_NODES} more node(s)")
    log.warning("%s", "; ".join(words))


def refused_unread(error_type: str) -> None:
    """A /prompt body refused before it was read as a prompt (its shape, its ids): the error type only, since
    the message quotes what the client sent (a forged id must not write into the log)."""
    log.warning("prompt refused before validation (%s); the client was told why", error_type)


def _one_line(error) -> str:
    if not isinstance(error, dict):
        return " ".join(str(error).split())
    message, details = str(error.get("message") or ""), str(error.get("details") or "")
    return " ".join((f"{message}: {details}" if details and details != message else message).split())


def started(prompt_id: str) -> None:
    log.info("prompt %s started", prompt_id)


def ended(prompt_id: str, success: bool, messages: list, outputs: dict, seconds: float) -> None:
    """The outcome from the run's status messages (ComfyUI's ``execution_error`` / ``execution_interrupted``
    payloads name the node) and the samplers' bind reports in ``outputs``."""
    events = dict((name, data) for name, data in messages if isinstance(data, dict))
    if "execution_interrupted" in events:
        data = events["execution_interrupted"]
        log.info("prompt %s interrupted at node %s (%s) after %.1f s", prompt_id, data.get("node_id"),
                 data.get("node_type"), seconds)
    elif not success:
        data = events.get("execution_error") or {}
        message = str(data.get("exception_message", "")).strip().splitlines()
        where = f"node {data['node_id']} ({data.get('node_type')})" if data.get("node_id") else "before any node ran"
        error_type = str(data.get("exception_type") or "error").rsplit(".", 1)[-1]
        log.warning("prompt %s failed at %s after %.1f s: %s: %s", prompt_id, where, seconds, error_type,
                    message[0] if message else "")
    else:
        log.info("prompt %s finished in %.1f s%s", prompt_id, seconds, "".join(
            f"; {line}" for line in bind_summaries(outputs)))


def bind_summaries(outputs: dict) -> list[str]:
    """"node 6 bound 2 LoRAs fused, 0 adapters (132 model parameters written, 0 restored)" per sampler."""
    lines = []
    for node_id, ui in (outputs or {}).items():
        for report in (ui or {}).get("lorabind_schedule") or []:
            bound = report.get("bind") if isinstance(report, dict) else None
            if bound:
                lines.append(f"node {node_id} bound {len(bound['fuses'])} fused LoRA(s) and "
                             f"{len(bound['adapters'])} adapter(s) ({bound['written']} model parameters written, "
                             f"{bound['restored']} restored)")
    return lines
