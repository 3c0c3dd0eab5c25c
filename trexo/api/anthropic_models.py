"""`GET /v1/models` in Anthropic's shape, for requests that carry `anthropic-version` (as
Anthropic's clients always send). Pure.

OpenAI and Anthropic share the path; the header tells them apart, as Anthropic's own API is
only ever called with it. A page is `{"data": [...], "has_more", "first_id", "last_id"}`,
each model `{"type": "model", "id", "display_name", "created_at"}`; `limit` (1-1000, default
20), `after_id` and `before_id` page through the node's listing in its order.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, Final

from trexo.api.errors import ApiError
from trexo.api.validation import read_int
from trexo.types.models import ModelRef

VERSION_HEADER: Final = "anthropic-version"
"""The header every Anthropic client sends: the request speaks Anthropic's API."""
MODELS_PATH: Final = "/v1/models"
DEFAULT_LIMIT: Final = 20
MAX_LIMIT: Final = 1000


def model_body(model: ModelRef) -> dict[str, Any]:
    created = datetime.fromtimestamp(model.created, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {
        "type": "model",
        "id": model.model_id,
        "display_name": model.model_id,
        "created_at": created,
    }


def models_page(models: Sequence[ModelRef], query: Mapping[str, str]) -> dict[str, Any]:
    """One page of `models` as `query` (`limit`, `after_id`, `before_id`) asks for it."""
    fields: dict[str, Any] = dict(query)
    if "limit" in fields:
        try:
            fields["limit"] = int(fields["limit"])
        except ValueError:
            raise ApiError(400, "limit: expected an integer", param="limit") from None
    limit = read_int(fields, "limit", low=1, high=MAX_LIMIT) or DEFAULT_LIMIT
    ids = [model.model_id for model in models]
    after, before = query.get("after_id"), query.get("before_id")
    if after is not None and before is not None:
        raise ApiError(400, "after_id and before_id cannot both be given", param="after_id")
    start, end = 0, len(models)
    if after is not None:
        start = _position(ids, after, "after_id") + 1
        end = min(len(models), start + limit)
    elif before is not None:
        end = _position(ids, before, "before_id")
        start = max(0, end - limit)
    else:
        end = min(len(models), limit)
    page = [model_body(model) for model in models[start:end]]
    more = end < len(models) if before is None else start > 0
    return {
        "data": page,
        "has_more": more,
        "first_id": page[0]["id"] if page else None,
        "last_id": page[-1]["id"] if page else None,
    }


def _position(ids: list[str], model_id: str, param: str) -> int:
    try:
        return ids.index(model_id)
    except ValueError:
        raise ApiError(404, f"model: {model_id}", param=param, code="not_found") from None
