"""OpenAI-shaped HTTP errors, and the contract's failures and terminal events as
such errors. No I/O."""

from __future__ import annotations

from typing import Any

from inferbus.contracts import (
    FailureCode,
    RequestCancelled,
    RequestFailed,
    RequestRejected,
    http_status,
)


class ApiError(Exception):
    """An OpenAI-shaped error: ``{"error": {"message", "type", "param", "code"}}``."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.type = status, message, type
        self.param, self.code, self.retry_after = param, code, retry_after

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }


_ERROR_TYPE = {
    400: "invalid_request_error",
    404: "invalid_request_error",
    409: "invalid_request_error",
    429: "rate_limit_error",
}


def failure_error(
    code: str,
    message: str,
    *,
    param: str | None = None,
    retry_after: float | None = None,
    default_status: int = 500,
) -> ApiError:
    """The HTTP error for a failure code of the contract: status from its table
    (``default_status`` for a code the table lacks), OpenAI error type by status."""
    status = http_status(code, default_status)
    return ApiError(
        status,
        message,
        type=_ERROR_TYPE.get(status, "server_error"),
        param=param,
        code=code,
        retry_after=retry_after,
    )


def error_for(event: RequestFailed | RequestRejected | RequestCancelled) -> ApiError:
    if isinstance(event, RequestRejected):  # the request's own fault: 400 unless known
        return failure_error(event.code, event.reason, param=event.param, default_status=400)
    if isinstance(event, RequestCancelled):
        code = FailureCode.CANCELLED
        return ApiError(http_status(code), event.reason, type="cancelled", code=code)
    wait = event.retry_after_s or 1.0
    return failure_error(event.code, event.reason, retry_after=wait if event.retryable else None)
