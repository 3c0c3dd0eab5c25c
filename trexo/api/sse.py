"""Server-sent events as OpenAI streams them: `data: {json}` events, then `data: [DONE]`."""

from __future__ import annotations

import json
from typing import Any

SSE_CONTENT_TYPE = "text/event-stream; charset=utf-8"
SSE_HEADERS = {
    "Cache-Control": "no-cache",
    # nginx buffers proxied responses unless told not to; a token stream must not wait.
    "X-Accel-Buffering": "no",
}
DONE = b"data: [DONE]\n\n"
KEEPALIVE = b": keep-alive\n\n"
"""A comment line: SSE clients ignore it, but it keeps idle-timeout proxies from closing."""


def dumps(body: Any) -> str:
    """Compact JSON, as every response body of the API is written."""
    return json.dumps(body, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def sse_event(body: Any) -> bytes:
    """One `data:` event. Compact JSON has no newline, so it never splits the event."""
    return b"data: " + dumps(body).encode() + b"\n\n"
