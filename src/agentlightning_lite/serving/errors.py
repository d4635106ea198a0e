"""The PolicyServer's error type: an HTTP status with an OpenAI-style JSON error body.

This is the HTTP edge of the package's exception family (:mod:`agentlightning_lite.errors`):
:func:`api_error_of` maps an ``AGLError`` to its status; any other exception a handler lets out
is a bug, answered by :func:`internal_error` (a 500 with a generic message, the traceback logged).
"""

from __future__ import annotations

import json
import logging
from typing import Any

from starlette.responses import JSONResponse as StarletteJSONResponse

from ..errors import AGLError, ConflictError, InvalidRequestError, LeaseError, UnknownRolloutError

__all__ = ["APIError", "JSONResponse", "api_error_of", "bad_request", "internal_error"]

logger = logging.getLogger(__name__)


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


#: (class, status, code) in the order they are tried: the most specific first
_STATUS: tuple[tuple[type[AGLError], int, str | None], ...] = (
    (UnknownRolloutError, 404, "rollout_not_found"),
    (LeaseError, 403, "invalid_lease"),
    (ConflictError, 409, "conflict"),
    (InvalidRequestError, 400, None),
)


def api_error_of(exc: AGLError, param: str | None = None, code: str | None = None) -> APIError:
    """The HTTP answer to an error the caller caused: 404, 403, 409 or 400 by its class.

    >>> from agentlightning_lite.errors import UnknownRolloutError
    >>> err = api_error_of(UnknownRolloutError("r-1"))
    >>> err.status, err.code, err.message
    (404, 'rollout_not_found', "unknown rollout 'r-1'")
    """
    for cls, status, default_code in _STATUS:
        if isinstance(exc, cls):
            if param is None and isinstance(exc, UnknownRolloutError):
                param = "rollout_id"
            return APIError(status, str(exc), param=param, code=code or default_code)
    return APIError(400, str(exc), param=param, code=code)


def internal_error(where: str | None = None, exc: BaseException | None = None) -> APIError:
    """The 500 for a bug in a handler: a generic message; ``exc``'s traceback goes to the log only.

    ``where``: what was being answered (``"POST /v1/chat/completions"``), for the log.
    """
    if exc is not None:
        logger.error("internal error answering %s", where or "a request", exc_info=exc)
    message = "The server had an internal error while processing your request (see the server's log)."
    return APIError(500, message, code="internal_error")
