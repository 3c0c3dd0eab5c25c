"""Cross-origin access (CORS): none by default; `--cors-origin ORIGIN` lets web pages in.

A browser lets a page of another origin read an API response only if the response names
that origin in `Access-Control-Allow-Origin`; before a JSON POST it first asks with an
`OPTIONS` preflight. The rules are pure functions of the request's headers (`CorsPolicy`);
`register_cors` hooks them into the app. Without configured origins no response carries an
`Access-Control-Allow-Origin`, so browsers keep other sites' pages out (a local API is
otherwise readable by any page the user opens). What browsers send without asking (simple
POSTs, forms) is refused by `trexo.api.cross_site`, which lets in the origins allowed here.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from urllib.parse import urlsplit

import attrs
from quart import Response, request
from quart.globals import request_ctx
from quart_trio import QuartTrio
from werkzeug.datastructures import Headers

from trexo.config import API_CORS_MAX_AGE_S

ANY_ORIGIN = "*"
DEFAULT_ALLOWED_HEADERS = "Authorization, Content-Type"
"""Allowed request headers when a preflight names none (it names them when it needs any)."""
EXPOSED = "Idempotency-Key, Retry-After"
"""Response headers a page may read besides the always-readable ones: when to retry, and
the key to retry a placement or deletion under."""


def normalize_origin(text: str) -> str:
    """`text` as browsers send it in `Origin` (`scheme://host[:port]`, lowercase), or `*`.

    Raises `ValueError` for anything else (a path, a missing scheme, ...).
    """
    text = text.strip()
    if text == ANY_ORIGIN:
        return text
    parts = urlsplit(text.rstrip("/"))
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(f"expected an origin like https://example.com[:port] or *, got {text!r}")
    if parts.path or parts.query or parts.fragment or "@" in parts.netloc:
        raise ValueError(f"an origin is scheme://host[:port] only, got {text!r}")
    return f"{parts.scheme}://{parts.netloc}".lower()


def normalize_origins(origins: Iterable[str]) -> tuple[str, ...]:
    return tuple(normalize_origin(origin) for origin in origins)


@attrs.frozen
class CorsPolicy:
    """Which origins may call the API from a browser, and how long a preflight is cached."""

    origins: tuple[str, ...] = attrs.field(default=(), converter=normalize_origins)
    max_age: int = API_CORS_MAX_AGE_S

    def allowed_origin(self, origin: str | None) -> str | None:
        """The `Access-Control-Allow-Origin` for a request from `origin`, or None."""
        if origin is None or not self.origins:
            return None
        if ANY_ORIGIN in self.origins:
            return ANY_ORIGIN
        try:
            return origin if normalize_origin(origin) in self.origins else None
        except ValueError:  # "null" (a sandboxed page or file://) or garbage
            return None

    def response_headers(self, origin: str | None) -> dict[str, str]:
        """Headers for any response to a request from `origin`."""
        allowed = self.allowed_origin(origin)
        if allowed is None:
            return {}
        return {"Access-Control-Allow-Origin": allowed, "Access-Control-Expose-Headers": EXPOSED}

    def options_headers(
        self, methods: Iterable[str], request_headers: Headers | Mapping[str, str]
    ) -> dict[str, str]:
        """Headers of the 204 answer to an `OPTIONS` request: `Allow`, and for a preflight
        from an allowed origin what it may send (its origin header comes with every
        response, `response_headers`)."""
        allow = ", ".join(sorted(set(methods)))
        headers = {"Allow": allow}
        preflight = "Access-Control-Request-Method" in request_headers
        if preflight and self.allowed_origin(request_headers.get("Origin")) is not None:
            requested = request_headers.get("Access-Control-Request-Headers", "").strip()
            headers.update(
                {
                    "Access-Control-Allow-Methods": allow,
                    "Access-Control-Allow-Headers": requested or DEFAULT_ALLOWED_HEADERS,
                    "Access-Control-Max-Age": str(self.max_age),
                }
            )
        return headers


def register_cors(app: QuartTrio, policy: CorsPolicy) -> None:
    """Answer `OPTIONS` with 204 (never Quart's default 200 text/html), and add the CORS
    headers of `policy` to every response."""

    @app.before_request
    async def answer_options() -> Response | None:
        if request.method != "OPTIONS" or request.url_rule is None:
            return None  # not OPTIONS, or an unknown URL: its 404 follows
        adapter = request_ctx.url_adapter
        methods = adapter.allowed_methods() if adapter is not None else ["OPTIONS"]
        response = app.response_class(b"", status=204)
        # A 204 has no body, so no Content-Type or Content-Length (RFC 9110 §8.6).
        response.headers.clear()
        response.headers.update(policy.options_headers(methods, request.headers))
        return response

    @app.after_request
    async def add_cors_headers(response: Response) -> Response:
        if policy.origins:
            # The answer depends on the Origin header: shared caches must key on it.
            response.vary.add("Origin")
            response.headers.update(policy.response_headers(request.headers.get("Origin")))
        return response
