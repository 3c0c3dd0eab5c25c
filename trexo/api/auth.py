"""API keys: with `--api-key`, every request but `GET /health` and the dashboard's files must
carry one.

A client presents its key as OpenAI's clients do (`Authorization: Bearer KEY`) or as
Anthropic's do (`x-api-key: KEY`); either header works on every path. Keys are compared in
constant time with every configured key (`hmac.compare_digest`), so neither the time taken
nor which key matched says anything about a key. A missing or wrong key is a 401 in the
dialect's error shape. CORS preflights (`OPTIONS`) pass: browsers never send credentials
with them. The dashboard's page and files (`/`, `/dashboard/NAME`) pass too: they hold no
data, and a browser loading a page cannot send a header; the page then asks for a key and
sends it on every API call. Keys appear in no log line, no config repr and no response.

Without keys the API is open, as it always was.
"""

from __future__ import annotations

import hmac
from collections.abc import Callable, Iterable, Mapping

import attrs
from quart import Response, request
from quart_trio import QuartTrio
from werkzeug.datastructures import Headers

from trexo.api.errors import ApiError

OPEN_PATHS = frozenset({"/health"})
"""What a load balancer or a monitor probes: no key needed (it says nothing about prompts)."""
PAGE_PATHS = frozenset({"/"})
PAGE_PREFIX = "/dashboard/"
PAGE_METHODS = frozenset({"GET", "HEAD"})
"""The dashboard's static files (`trexo.api.dashboard`): no key needed, since they hold no
data (everything the page shows comes from the API, with the key)."""
BEARER_PREFIX = "bearer "
API_KEY_HEADER = "x-api-key"
INVALID_API_KEY = "invalid_api_key"
WWW_AUTHENTICATE = 'Bearer realm="trexo"'


def _encoded(keys: Iterable[str]) -> tuple[bytes, ...]:
    return tuple(key.encode() for key in keys)


@attrs.frozen
class ApiKeys:
    """The keys the API accepts; none: the API is open."""

    keys: tuple[bytes, ...] = attrs.field(default=(), converter=_encoded, repr=False)

    def required_for(self, method: str, path: str) -> bool:
        return (
            bool(self.keys)
            and method != "OPTIONS"
            and path not in OPEN_PATHS
            and not is_page_file(method, path)
        )

    def accepts(self, presented: str | None) -> bool:
        """Whether `presented` is one of the keys; compares with every key, in constant time."""
        if presented is None:
            return False
        candidate = presented.encode(errors="surrogateescape")  # headers may hold anything
        matched = False
        for key in self.keys:
            matched |= hmac.compare_digest(candidate, key)
        return matched


def is_page_file(method: str, path: str) -> bool:
    """Whether the request reads one of the dashboard's static files."""
    return method in PAGE_METHODS and (path in PAGE_PATHS or path.startswith(PAGE_PREFIX))


def presented_key(headers: Headers | Mapping[str, str]) -> str | None:
    """The key a request carries: a Bearer token, else `x-api-key`; None if neither."""
    authorization = headers.get("Authorization")
    if authorization is not None and authorization[: len(BEARER_PREFIX)].lower() == BEARER_PREFIX:
        return authorization[len(BEARER_PREFIX) :].strip()
    return headers.get(API_KEY_HEADER)


def unauthorized(presented: str | None) -> ApiError:
    """The 401 for a request without a valid key (never quoting what it sent)."""
    if presented is None:
        message = (
            "You didn't provide an API key. Provide it in an Authorization header using "
            "Bearer auth (Authorization: Bearer YOUR_KEY), or in an x-api-key header."
        )
    else:
        message = "Incorrect API key provided."
    return ApiError(401, message, code=INVALID_API_KEY)


def register_auth(
    app: QuartTrio, keys: Iterable[str], error_response: Callable[[ApiError], Response]
) -> None:
    """Refuse, with a 401 made by `error_response`, every request that needs a key and has
    no valid one. Register it after the body is read (see `create_app`'s `read_body`)."""
    api_keys = ApiKeys(tuple(keys))
    if not api_keys.keys:
        return

    @app.before_request
    async def require_api_key() -> Response | None:
        if not api_keys.required_for(request.method, request.path):
            return None
        presented = presented_key(request.headers)
        if api_keys.accepts(presented):
            return None
        response = error_response(unauthorized(presented))
        response.headers["WWW-Authenticate"] = WWW_AUTHENTICATE
        return response
