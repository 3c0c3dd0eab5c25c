"""What keeps web pages from using a node: any page the user opens can make the browser
send requests to a node on 127.0.0.1 (or the LAN). Three rules, checked on both listeners:

1. **`Host` names the node** (`HostNames`): a loopback name (`localhost`, `*.localhost`), a
   private one (`*.internal`: a container's name for its host), an IP address, the address
   the API is bound to, the machine's own name, or one added with `--api-allowed-host`
   (`*`: any name). Otherwise a page on a name its author controls, once that name
   resolves to 127.0.0.1 (DNS rebinding), is the node's own origin to the browser and
   could read everything. An IP address is always accepted: rebinding needs a
   DNS name. A request without `Host` (HTTP/1.0) comes from no browser and is served.
2. **`Origin`, when present, is the node's own or a configured one** (`--cors-origin`), on
   every method but a CORS preflight (`OPTIONS`, answered without permission for other
   origins: `trexo.api.cors`). Browsers send `Origin` with every request that can change
   something (every POST, PUT, PATCH and DELETE; `null` where privacy hides the page) and
   with every request whose answer a page reads cross-origin; non-browser clients (curl,
   the OpenAI, Anthropic and Ollama clients) send none. So another origin is refused (403)
   whatever its method and content type. What a page fetches without `Origin` (an image,
   a script, a frame: GETs) modern browsers mark `Sec-Fetch-Site: cross-site` (or
   `same-site`); such a request is refused too, but for a link to the dashboard's page
   (`Sec-Fetch-Mode: navigate`): some GETs do work (a placement preview asks the hub).
3. **A browser's JSON body is declared JSON** (`json_body_refusal`, applied when a view
   reads JSON): with an `Origin`, the content type must be `application/json` (or
   `application/*+json`), which a page can send only after a preflight; a `text/plain`, form
   or multipart body is what a page can send anywhere without asking, so it is refused (415)
   even from an allowed origin. Without an `Origin` any content type is read as JSON:
   `curl URL -d '{...}'`, as Ollama's docs show it, sends the JSON as a form.

Behind a reverse proxy that changes the scheme or the name, add the proxy's name with
`--api-allowed-host` and the page's origin with `--cors-origin`.
"""

from __future__ import annotations

import ipaddress
import re
import socket
from collections.abc import Callable, Mapping
from urllib.parse import urlsplit

import attrs
from quart import Response, request
from quart_trio import QuartTrio
from werkzeug.datastructures import Headers

from trexo.api.auth import is_page_file
from trexo.api.cors import CorsPolicy
from trexo.api.errors import ApiError
from trexo.config import ApiConfig

ANY_HOST = "*"
LOOPBACK_NAME = "localhost"
LOOPBACK_SUFFIX = ".localhost"
"""RFC 6761: browsers resolve these to loopback themselves, never asking DNS."""
INTERNAL_SUFFIX = ".internal"
"""Names a machine gives its neighbours (Docker's `host.docker.internal`, Podman's
`host.containers.internal`): reserved for private use (ICANN, 2024), so no public DNS
answers for them and rebinding cannot use one."""
MDNS_SUFFIX = ".local"
DEFAULT_PORTS = {"http": 80, "https": 443}
PREFLIGHT_METHOD = "OPTIONS"
OTHER_SITES = frozenset({"cross-site", "same-site"})
"""`Sec-Fetch-Site` values of a request another site's page made (`same-site`: another port
or subdomain of the node's site; `same-origin` and `none`, typed by the user, are fine)."""
NAVIGATE = "navigate"
_HOST_CHARS = re.compile(r"[A-Za-z0-9._~%:\[\]-]+")
"""What a `Host` header may hold: a name or address, and a port."""
_LABEL = r"[a-z0-9_]([a-z0-9_-]{0,61}[a-z0-9_])?"
_NAME = re.compile(rf"{_LABEL}(\.{_LABEL})*")
"""A DNS name (letters, digits, hyphens, underscores; dot-separated labels), lowercase."""
NAME_MAX_CHARS = 253
QUOTED_MAX_CHARS = 100
"""An error message quotes at most this much of what a client sent."""
JSON_TYPE = "application/json"


def parse_host(header: str) -> str | None:
    """The name or address a `Host` header gives (lowercase, without port, brackets or a
    final dot), or None if it is not one."""
    header = header.strip()
    if not _HOST_CHARS.fullmatch(header):
        return None
    try:
        parts = urlsplit(f"//{header}")
        parts.port  # noqa: B018 -- raises on a port that is not a number
    except ValueError:
        return None
    if parts.hostname is None or parts.path or parts.query or parts.fragment:
        return None
    return parts.hostname.rstrip(".") or None


def is_ip_address(hostname: str) -> bool:
    try:
        ipaddress.ip_address(hostname)
    except ValueError:
        return False
    return True


def normalize_host_name(text: str) -> str:
    """A name for `--api-allowed-host`: a DNS name (lowercase) or `*`; ValueError if not."""
    name = text.strip().lower().rstrip(".")
    if name == ANY_HOST or is_ip_address(name):
        return name
    if len(name) <= NAME_MAX_CHARS and _NAME.fullmatch(name):
        return name
    raise ValueError(f"expected a host name (no scheme, no port) or *, got {text!r}")


def _machine_names(machine: str) -> tuple[str, ...]:
    """The machine's name as `gethostname` gives it, and as mDNS (`NAME.local`) serves it."""
    name = machine.strip().lower().rstrip(".")
    if not name:
        return ()
    bare = name.removesuffix(MDNS_SUFFIX)
    return (name, bare, bare + MDNS_SUFFIX)


@attrs.frozen
class HostNames:
    """The names a request's `Host` may give: see rule 1 in this module's docstring."""

    extra: tuple[str, ...] = ()
    """`--api-allowed-host`; `*`: any name."""
    bind: str = ""
    """The address the API listens on: a name counts too."""
    machine: str = ""
    """The machine's own name (`socket.gethostname()`)."""

    def accepts(self, hostname: str | None) -> bool:
        if ANY_HOST in self.extra:
            return True
        if not hostname:
            return False
        if hostname == LOOPBACK_NAME or hostname.endswith((LOOPBACK_SUFFIX, INTERNAL_SUFFIX)):
            return True
        if is_ip_address(hostname):
            return True
        extra = (name.lower().rstrip(".") for name in self.extra)
        return hostname in (*extra, self.bind.lower(), *_machine_names(self.machine))


def _origin_key(scheme: str, hostname: str | None, port: int | None) -> tuple[str, str, int]:
    return scheme, hostname or "", port if port is not None else DEFAULT_PORTS.get(scheme, -1)


def same_origin(origin: str, scheme: str, host_header: str | None) -> bool:
    """Whether `origin` (an `Origin` header) is the origin of a request to `scheme` and
    `host_header`: the node's own page."""
    if host_header is None:
        return False
    try:
        theirs = urlsplit(origin.strip())
        ours = urlsplit(f"//{host_header.strip()}")
        their_key = _origin_key(theirs.scheme.lower(), theirs.hostname, theirs.port)
        our_key = _origin_key(scheme.lower(), ours.hostname, ours.port)
    except ValueError:  # a port that is not a number, a broken IPv6 literal
        return False
    if theirs.path or theirs.query or theirs.fragment or "@" in theirs.netloc:
        return False
    return theirs.scheme.lower() in DEFAULT_PORTS and their_key == our_key


def _quoted(text: str) -> str:
    return repr(text[:QUOTED_MAX_CHARS])


def host_header(headers: Headers | Mapping[str, str]) -> str | None:
    """`Host` (hypercorn gives HTTP/2's `:authority` as `Host`); None if it is missing or
    empty (hypercorn gives an HTTP/1.0 request without one an empty `Host`)."""
    return headers.get("Host") or None


def cross_site_refusal(
    method: str,
    scheme: str,
    path: str,
    headers: Headers | Mapping[str, str],
    names: HostNames,
    cors: CorsPolicy,
) -> ApiError | None:
    """The 403 for a request that rules 1 or 2 refuse; None if it may go on."""
    host = host_header(headers)
    if host is not None and not names.accepts(parse_host(host)):
        return ApiError(
            403,
            f"The Host header {_quoted(host)} does not name this node, so the request may "
            "come from a web page on another site; start the node with "
            "--api-allowed-host NAME to accept a name",
            code="host_not_allowed",
        )
    if method == PREFLIGHT_METHOD:
        return None
    origin = headers.get("Origin")
    if origin is None:
        return None if page_may_ask(method, path, headers) else _other_site()
    if same_origin(origin, scheme, host) or cors.allowed_origin(origin) is not None:
        return None
    return ApiError(
        403,
        f"Requests from web pages of another origin ({_quoted(origin)}) are refused; start "
        "the node with --cors-origin ORIGIN to let an origin's pages call the API",
        code="origin_not_allowed",
    )


def page_may_ask(method: str, path: str, headers: Headers | Mapping[str, str]) -> bool:
    """Whether a request without `Origin` may go on: one that no page of another site made
    (`Sec-Fetch-Site`; clients other than browsers send none), or a link from such a page to
    the dashboard's page (the page itself refuses to be framed: `trexo.api.dashboard`)."""
    if headers.get("Sec-Fetch-Site", "").strip().lower() not in OTHER_SITES:
        return True
    navigation = headers.get("Sec-Fetch-Mode", "").strip().lower() == NAVIGATE
    return navigation and is_page_file(method, path)


def _other_site() -> ApiError:
    return ApiError(
        403,
        "Requests a web page of another site makes without asking (an image, a script, a "
        "frame, a link to anything but the dashboard's page) are refused; open the address "
        "directly, or start the node with --cors-origin ORIGIN and fetch it from that origin",
        code="origin_not_allowed",
    )


def is_json_type(content_type: str | None) -> bool:
    if content_type is None:
        return False
    media = content_type.split(";", 1)[0].strip().lower()
    return media == JSON_TYPE or (media.startswith("application/") and media.endswith("+json"))


def json_body_refusal(headers: Headers | Mapping[str, str]) -> ApiError | None:
    """The 415 for a JSON body a browser did not declare JSON (rule 3); None if it may be
    read."""
    if headers.get("Origin") is None or is_json_type(headers.get("Content-Type")):
        return None
    return ApiError(
        415,
        f"A request from a web page must send its JSON body as Content-Type: {JSON_TYPE}",
        param="Content-Type",
        code="unsupported_media_type",
    )


def register_cross_site(
    app: QuartTrio, config: ApiConfig, error_response: Callable[[ApiError], Response]
) -> None:
    """Refuse, with an error made by `error_response`, every request that rules 1 and 2
    refuse. Register it after the body is read (see `create_app`'s `read_body`)."""
    names = HostNames(config.allowed_hosts, bind=config.host, machine=socket.gethostname())
    cors = CorsPolicy(config.cors_origins, config.cors_max_age)

    @app.before_request
    async def refuse_cross_site() -> Response | None:
        refusal = cross_site_refusal(
            request.method, request.scheme, request.path, request.headers, names, cors
        )
        return None if refusal is None else error_response(refusal)
