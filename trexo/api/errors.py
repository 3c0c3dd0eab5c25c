"""OpenAI-style HTTP errors: `ApiError`, its JSON body, and the mapping from cluster errors.

Every error the API returns has the body `{"error": {"message", "type", "param", "code"}}`,
whatever raised it: request validation, a `ClusterError` from the node, or Quart itself.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Literal

from trexo.errors import (
    ClusterError,
    CommandRefused,
    GenerationFailed,
    GenerationRejected,
    IdempotencyKeyReused,
    InstanceNotFound,
    ModelLoadFailed,
    ModelNotFound,
    NodeNotFound,
    NoDiskSpace,
    NoSession,
    PlacementRefused,
    RepoAccessDenied,
    TaskNotFound,
    TrexoError,
    Unavailable,
)

ErrorType = Literal["invalid_request_error", "server_error"]

INVALID_REQUEST: ErrorType = "invalid_request_error"
SERVER_ERROR: ErrorType = "server_error"


class ApiError(TrexoError):
    """An HTTP error response, raised anywhere in a request and answered as OpenAI does."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: ErrorType = INVALID_REQUEST,
        param: str | None = None,
        code: str | None = None,
        retry_after_s: float | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self._headers = dict(headers or {})
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.retry_after_s = retry_after_s

    def body(self) -> dict[str, Any]:
        return error_body(self.message, type=self.type, param=self.param, code=self.code)

    def headers(self) -> dict[str, str]:
        if self.retry_after_s is None:
            return dict(self._headers)
        # Retry-After takes whole seconds; round up so a client never retries too early.
        return {**self._headers, "Retry-After": str(max(1, math.ceil(self.retry_after_s)))}

    def __repr__(self) -> str:
        return (
            f"ApiError({self.status}, {self.message!r}, param={self.param!r}, code={self.code!r})"
        )


def error_body(
    message: str,
    *,
    type: ErrorType = INVALID_REQUEST,
    param: str | None = None,
    code: str | None = None,
) -> dict[str, Any]:
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


def internal_error() -> ApiError:
    """For an unexpected exception: its details go to the log, not to the client."""
    return ApiError(500, "internal server error", type=SERVER_ERROR, code="internal_error")


def cluster_error_to_api(exc: ClusterError) -> ApiError:
    """The HTTP error for a cluster error (see `trexo.api.handle`)."""
    message = str(exc) or type(exc).__doc__ or type(exc).__name__
    match exc:
        case Unavailable():
            code = "no_session" if isinstance(exc, NoSession) else "model_unavailable"
            return ApiError(
                503, message, type=SERVER_ERROR, code=code, retry_after_s=exc.retry_after_s
            )
        case ModelNotFound():
            return ApiError(404, message, code="model_not_found")
        case NoDiskSpace():
            return ApiError(507, message, type=SERVER_ERROR, code="insufficient_storage")
        case RepoAccessDenied():
            return ApiError(403, message, code="model_access_denied")
        case InstanceNotFound():
            return ApiError(404, message, code="instance_not_found")
        case NodeNotFound():
            # A value in the body, not the URL's resource: a bad request.
            return ApiError(400, message, param="node_id", code="node_not_found")
        case TaskNotFound():
            return ApiError(404, message, param="request_id", code="request_not_found")
        case PlacementRefused():
            return ApiError(400, message, code="placement_refused")
        case CommandRefused():
            return ApiError(400, message, code="command_refused")
        case IdempotencyKeyReused():
            return ApiError(422, message, param="Idempotency-Key", code="idempotency_key_reused")
        case GenerationRejected():
            return ApiError(400, message, code="invalid_request")
        case ModelLoadFailed():
            return ApiError(500, message, type=SERVER_ERROR, code="model_load_failed")
        case GenerationFailed():
            return ApiError(500, message, type=SERVER_ERROR, code="generation_failed")
        case _:
            return ApiError(500, message, type=SERVER_ERROR, code="cluster_error")


def find_api_error(exc: BaseException) -> ApiError | None:
    """The `ApiError` that `exc` stands for, looking inside exception groups.

    The node's context managers may run nurseries, which wrap what passes through them in
    `ExceptionGroup`s; the first `ApiError` or `ClusterError` inside decides. None means an
    unexpected error (a bug): log it and answer `internal_error()`.
    """
    if isinstance(exc, ApiError):
        return exc
    if isinstance(exc, ClusterError):
        return cluster_error_to_api(exc)
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            if (found := find_api_error(inner)) is not None:
                return found
    return None
