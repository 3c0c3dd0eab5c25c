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


LINE_SEPARATORS = {"\u2028": "\\u2028", "\u2029": "\\u2029", "\u0085": "\\u0085"}
"""Characters that are no line break to JSON but are to other readers: httpx's `iter_lines()`
(the ollama client's) and JavaScript before ES2019 split lines at them, so a generated U+2028
would cut an NDJSON line or an SSE event in two. Escaped, as real Ollama writes them."""
_ESCAPES = str.maketrans(LINE_SEPARATORS)


def dumps(body: Any) -> str:
    """Compact JSON, as every response body of the API is written (line separators escaped:
    they can only occur inside strings, where the escape means the same character)."""
    text = json.dumps(body, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    return text.translate(_ESCAPES)


def sse_event(body: Any) -> bytes:
    """One `data:` event. Compact JSON has no newline, so it never splits the event."""
    return b"data: " + dumps(body).encode() + b"\n\n"
