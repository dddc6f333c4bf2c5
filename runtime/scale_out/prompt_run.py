"""Run one prompt on a replica's executor, or on one rank of a replica's group, into one result payload.

Why shared: a whole-model replica and rank 0 of a ``--parallel`` replica do the same thing (execute, carry the
files each ``executed`` event names, count the binds that wrote weights) and answer the front in the same shape;
the other ranks do it too, and their files are dropped (rank 0's copy is the one the user gets).
"""

from __future__ import annotations

import os
import tempfile
import threading

from ...loaders.models import store as model_store
from .. import folder_paths
from .outputs import keep_only, take_files


def fuse_passes() -> int:
    """Binds that wrote or restored weights, over every model this process has loaded."""
    return sum(model.binding_state.stats.fuse_passes for model in model_store.loaded_models()
               if model.binding_state is not None)


def run_prompt(executor, prompt: dict, prompt_id: str, extra_data: dict, outputs: list, folders: dict,
               on_event, interrupt: threading.Event, sync=None) -> dict:
    """Execute ``prompt``; each event goes to ``on_event(name, data)`` with the bytes of the files an ``executed``
    event names in ``folders`` (kept there while the output cache may replay them). Returns the payload the front turns into an ``ExecutionResult``, or
    ``{"failure": text}`` for an exception outside any node, with ``fuses`` either way."""
    def carrying_files(name: str, data: dict) -> None:
        if name == "executed":  # carry the files this node wrote (the front has its own output folder)
            data = {**data, "lorabind_files": take_files(data.get("output"), folders)}
        on_event(name, data)

    before = fuse_passes()
    try:
        result = executor.execute(prompt, prompt_id, extra_data=extra_data, on_event=carrying_files,
                                  interrupt_event=interrupt, execute_outputs=outputs, sync=sync)
        payload = {"success": result.success, "outputs": result.outputs, "messages": result.messages,
                   "meta": result.meta, "error": result.error, "interrupted": result.interrupted,
                   "executed": result.executed, "cached": result.cached}
    except Exception as exc:  # e.g. a file removed since the front validated: reported, not raised
        payload = {"failure": f"{type(exc).__name__}: {exc}"}
    keep_only(executor.cached_uis(), folders)
    payload["fuses"] = fuse_passes() - before
    return payload


def private_folders(models_root: str, input_dir: str, lora_dirs: tuple, prefix: str) -> dict:
    """Root this process's folder registry at the front's models and inputs, with output and temp folders of its
    own (a replica or rank may run on another machine); returns {"output": ..., "temp": ...}."""
    work = tempfile.mkdtemp(prefix=prefix)
    folders = {"output": os.path.join(work, "output"), "temp": os.path.join(work, "temp")}
    folder_paths.configure(models_root=models_root, output_dir=folders["output"], input_dir=input_dir,
                           temp_dir=folders["temp"])
    for folder in lora_dirs:  # the front's --allow-lora-dir folders (the same paths on every node)
        folder_paths.add_model_folder_path("loras", folder)
    return folders
