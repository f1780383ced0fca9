"""OpenAI-style errors: {"error": {"message", "type", "param", "code"}} with the right HTTP status."""

from __future__ import annotations

from typing import Any

from starlette.responses import JSONResponse


class ApiError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
        too_long: tuple[int, int] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.headers = headers or {}
        self.too_long = too_long  # context_length_exceeded: the prompt's tokens and the most a slot takes

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


def invalid(message: str, param: str | None = None, code: str | None = "invalid_value") -> ApiError:
    return ApiError(400, message, param=param, code=code)


def too_long(message: str, param: str | None, n_tokens: int, n_max: int) -> ApiError:
    """A prompt (or its media) that no slot can hold: a 400 that carries the two counts (Anthropic's
    dialect words it its own way)."""
    return ApiError(400, message, param=param, code="context_length_exceeded", too_long=(n_tokens, n_max))
