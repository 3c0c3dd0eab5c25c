"""Cluster errors become HTTP errors; the error body is OpenAI's."""

from __future__ import annotations

import pytest

from trexo.api.errors import ApiError, cluster_error_to_api, error_body, find_api_error
from trexo.errors import (
    ClusterError,
    CommandRefused,
    GenerationFailed,
    InstanceNotFound,
    ModelNotFound,
    NoSession,
    PlacementRefused,
)


def test_error_body_shape() -> None:
    assert error_body("bad", param="p", code="c") == {
        "error": {"message": "bad", "type": "invalid_request_error", "param": "p", "code": "c"}
    }
    assert ApiError(500, "boom", type="server_error").body() == {
        "error": {"message": "boom", "type": "server_error", "param": None, "code": None}
    }


@pytest.mark.parametrize(
    ("exc", "status", "code"),
    [
        (NoSession(), 503, "no_session"),
        (ModelNotFound("no m"), 404, "model_not_found"),
        (InstanceNotFound("no i"), 404, "instance_not_found"),
        (PlacementRefused("too big"), 400, "placement_refused"),
        (CommandRefused("no"), 400, "command_refused"),
        (GenerationFailed("died"), 500, "generation_failed"),
        (ClusterError("?"), 500, "cluster_error"),
    ],
)
def test_cluster_errors_map_to_statuses(exc: ClusterError, status: int, code: str) -> None:
    error = cluster_error_to_api(exc)
    assert (error.status, error.code) == (status, code)
    assert error.type == ("server_error" if status >= 500 else "invalid_request_error")
    assert error.message


def test_no_session_has_retry_after_in_whole_seconds() -> None:
    assert cluster_error_to_api(NoSession()).headers() == {"Retry-After": "1"}
    slow = NoSession()
    slow.retry_after_s = 2.2
    assert cluster_error_to_api(slow).headers() == {"Retry-After": "3"}
    assert cluster_error_to_api(ModelNotFound()).headers() == {}


def test_an_empty_message_falls_back_to_the_docstring() -> None:
    assert "election" in cluster_error_to_api(NoSession()).message


def test_find_api_error_looks_inside_groups() -> None:
    api = ApiError(400, "x")
    assert find_api_error(api) is api
    assert find_api_error(ValueError()) is None
    nested = ExceptionGroup("outer", [ValueError(), ExceptionGroup("inner", [ModelNotFound()])])
    found = find_api_error(nested)
    assert found is not None
    assert found.status == 404
    assert find_api_error(ExceptionGroup("g", [KeyError()])) is None
