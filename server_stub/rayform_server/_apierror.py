"""The error answer of every endpoint: an HTTP status, a protocol error code, a message."""

from __future__ import annotations

from starlette.responses import JSONResponse

__all__ = ["ApiError"]


class ApiError(Exception):
    """An error answer: HTTP status, protocol error code, message, extra headers."""

    def __init__(
        self, status: int, code: str, message: str, headers: dict[str, str] | None = None
    ) -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.headers = status, code, message, headers or {}

    def response(self) -> JSONResponse:
        return JSONResponse(
            {"error": self.code, "message": self.message}, self.status, headers=self.headers
        )
