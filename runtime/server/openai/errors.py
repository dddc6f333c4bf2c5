"""OpenAI's error shape for the ``/v1`` endpoints: ``{"error": {"message", "type", "param", "code"}}``.

Why a shape of its own: OpenAI clients (the official ``openai`` package among them) read exactly these keys to
raise ``BadRequestError`` with the message; ComfyUI's ``{"error": {"type", "message", "details"}}`` would reach
them as an unexplained failure.
"""

from __future__ import annotations

from typing import Optional

from aiohttp import web

_TYPES = {400: "invalid_request_error", 404: "not_found_error", 413: "invalid_request_error",
          500: "server_error"}


class OpenAIRequestError(Exception):
    """A request the server refuses or could not serve; ``param`` names the request field at fault."""

    def __init__(self, message: str, *, param: Optional[str] = None, code: Optional[str] = None,
                 status: int = 400):
        super().__init__(message)
        self.message, self.param, self.code, self.status = message, param, code, status

    def response(self) -> web.Response:
        return error_response(self.message, status=self.status, param=self.param, code=self.code)


def error_response(message: str, *, status: int = 400, param: Optional[str] = None,
                   code: Optional[str] = None) -> web.Response:
    body = {"error": {"message": message, "type": _TYPES.get(status, "invalid_request_error"), "param": param,
                      "code": code}}
    return web.json_response(body, status=status)
