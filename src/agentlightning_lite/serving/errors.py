"""The PolicyServer's error type: an HTTP status with an OpenAI-style JSON error body."""

from __future__ import annotations

import json
from typing import Any

from starlette.responses import JSONResponse as StarletteJSONResponse

__all__ = ["APIError", "JSONResponse", "bad_request"]


class JSONResponse(StarletteJSONResponse):
    """Starlette's JSON response, but text that is not valid UTF-8 (a lone surrogate echoed back
    from a request) is sent escaped instead of failing the response with a 500."""

    def render(self, content: Any) -> bytes:
        return json.dumps(
            content, ensure_ascii=False, allow_nan=False, indent=None, separators=(",", ":")
        ).encode("utf-8", "backslashreplace")


class APIError(Exception):
    """An error answered with an OpenAI-style body ``{"error": {message, type, param, code}}``.

    >>> APIError(400, "bad", param="n").body()
    {'error': {'message': 'bad', 'type': 'invalid_request_error', 'param': 'n', 'code': None}}
    """

    def __init__(
        self,
        status: int,
        message: str,
        type: str | None = None,
        param: str | None = None,
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type or ("invalid_request_error" if status < 500 else "server_error")
        self.param = param
        self.code = code

    def body(self) -> dict[str, Any]:
        """The JSON body of the error response."""
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        """The error as a starlette response."""
        return JSONResponse(self.body(), status_code=self.status)


def bad_request(message: str, param: str | None = None, code: str | None = None) -> APIError:
    """A 400 ``invalid_request_error``.

    >>> bad_request("'n' must be an integer", "n").status
    400
    """
    return APIError(400, message, param=param, code=code)
