"""A finished prompt's history entry -> what the ``/v1`` endpoints answer: its files (as data URLs, ``/view``
links or bytes) or the error, named by the request field that caused it.

Files are found through the history's ``images`` entries (ComfyUI's ``{filename, subfolder, type}``) and read
from the folder behind ``type``, confined to it like ``/view``. A one-frame result is an image (PNG); several
frames are a video (an animated WebP, or the MP4 / WebM of LoraBindSaveVideo).
"""

from __future__ import annotations

import base64
import os
import re
import urllib.parse
from dataclasses import dataclass

from ..config import ServerConfig
from ..media_types import media_type
from .errors import OpenAIRequestError
from .templates import Template

_USER_ERRORS = ("ContractError", "KeyMatchError", "LoraFileError")  # the request asked for something impossible


@dataclass
class ResultFile:
    path: str
    query: str  # filename=…&subfolder=…&type=… for /view
    mime: str
    animated: bool

    def data_url(self) -> str:
        return f"data:{self.mime};base64,{self.b64()}"

    def b64(self) -> str:
        with open(self.path, "rb") as handle:
            return base64.b64encode(handle.read()).decode("ascii")

    def view_url(self, origin: str) -> str:
        return f"{origin}/view?{self.query}"


def result_files(entry: dict, config: ServerConfig) -> list[ResultFile]:
    """Every saved image/video of the entry, in node order."""
    files = []
    for node_output in (entry.get("outputs") or {}).values():
        animated = any((node_output or {}).get("animated") or [])
        for image in (node_output or {}).get("images") or []:
            path = _confined(config, image)
            if path is None:
                continue
            mime = media_type(path)
            query = urllib.parse.urlencode({"filename": image.get("filename"), "subfolder": image.get("subfolder", ""),
                                            "type": image.get("type", "output")})
            files.append(ResultFile(path, query, mime, animated))
    return files


def _confined(config: ServerConfig, image: dict):
    folder = config.directory_for(image.get("type", "output"))
    if folder is None or not isinstance(image.get("filename"), str):
        return None
    root = os.path.realpath(folder)
    path = os.path.realpath(os.path.join(root, str(image.get("subfolder") or ""), image["filename"]))
    return path if path.startswith(root + os.sep) and os.path.isfile(path) else None


def failure(template: Template, entry: dict, sent=None) -> OpenAIRequestError:
    """Why the prompt did not finish: a contract mismatch (and other refusals of the request's own values) is a
    400 naming the file and the request field; an interrupt or a server-side failure is a 500."""
    events = {name: data for name, data in (entry.get("status") or {}).get("messages", []) if isinstance(data, dict)}
    if "execution_interrupted" in events:
        return OpenAIRequestError("the prompt was interrupted (POST /interrupt) before it finished", status=500,
                                  code="interrupted")
    error = events.get("execution_error") or {}
    text = str(error.get("exception_message", "the prompt failed")).strip()
    node_id = error.get("node_id")
    if not str(error.get("exception_type", "")).endswith(_USER_ERRORS):
        return OpenAIRequestError(f"node {node_id} ({error.get('node_type')}) failed: {text}", status=500,
                                  code="execution_error")
    named = _named_field(template, node_id, sent or {}, text)
    if named is None:
        return OpenAIRequestError(f"{text} ({template.file_name})", code="contract_mismatch")
    node_id, input_name, request_field = named
    return OpenAIRequestError(f"{request_field}: {text} (the request's {request_field} sets {input_name} of node "
                              f"{node_id} in {template.file_name})", param=request_field, code="contract_mismatch")


def _named_field(template: Template, node_id, sent: dict, text: str):
    """(node id, input, request field) a refusal is about: an input of the failing node it names, by the input's
    name or the request field's (MiniMax-H3 says "requires flow_shift=6"); else a field the request sent to another
    node (the Turbo schedule node's task, refused by the sampler: "got task='ref2va'"). None when it names none."""
    own = template.fields_of(node_id, sent) if node_id in template.prompt else {}
    for input_name, request_field in own.items():
        if _names(text, input_name) or _names(text, request_field):
            return node_id, input_name, request_field
    for other in template.prompt:
        for input_name, request_field in template.fields_of(other, sent).items():
            if request_field in sent.values() and _names(text, request_field):
                return other, input_name, request_field
    return None


def _names(text: str, name: str) -> bool:
    """Whether a refusal is about ``name``: "…: steps must be 4, got 20", "… requires shift=6, got …",
    "…: boundary=0.5 runs 1 of 4 steps on the high-noise expert…", "…, got task='ref2va'"."""
    name = re.escape(name)
    return re.search(rf"\b{name} must\b|(?:: |requires |got ){name}=", text) is not None
