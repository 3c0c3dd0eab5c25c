"""How a generation failed, so the API can answer with the status that fits."""

from __future__ import annotations

import enum


class FailureKind(enum.Enum):
    INVALID_REQUEST = "invalid_request"
    """The request cannot be served as it is (e.g. it does not fit the context): HTTP 400."""
    UNAVAILABLE = "unavailable"
    """Its runner died or is restarting, or the session changed: retry shortly (HTTP 503)."""
    INTERNAL = "internal"
    """Anything else: HTTP 500."""
