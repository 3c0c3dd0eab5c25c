"""A small answer from the hub (a repository's listing), read whole but bounded.

huggingface_hub reads an answer whole into memory, however large, and parses it with the
standard library's JSON parser, which recurses once per level of nesting. trexo reads the
listing itself, through huggingface_hub's own HTTP session (its headers, token, proxies and
redirects): at most `max_bytes` (after decompression), within `deadline` seconds in all (the
session's timeout bounds each silence; this bounds a hub that drips), and leaves the parsing
to `trexo.safe_json`. Blocking: call from a worker thread or the download process.
"""

from __future__ import annotations

import time
from typing import Any

from trexo.errors import HubUnreachable, UnsafeHubData


def get_small(
    url: str,
    *,
    params: dict[str, Any],
    timeout: float,
    deadline: float,
    max_bytes: int,
    what: str,
) -> bytes:
    """The body of a GET of `url`; `UnsafeHubData` if it is larger than `max_bytes`,
    `HubUnreachable` if it has not arrived whole in `deadline` seconds. An HTTP error is
    raised as huggingface_hub raises it (`map_hub_errors` maps it)."""
    from huggingface_hub.utils import (  # type: ignore[attr-defined]
        build_hf_headers,
        get_session,
        hf_raise_for_status,
    )

    give_up_at = time.monotonic() + deadline
    body = bytearray()
    with get_session().stream(
        "GET", url, params=params, headers=build_hf_headers(), timeout=timeout
    ) as response:
        declared = response.headers.get("Content-Length", "")
        if declared.isdigit() and int(declared) > max_bytes:
            raise UnsafeHubData(f"{what} is larger than {max_bytes} bytes ({declared} announced)")
        for chunk in response.iter_bytes():
            body += chunk
            if len(body) > max_bytes:
                raise UnsafeHubData(f"{what} is larger than {max_bytes} bytes")
            if time.monotonic() > give_up_at:
                raise HubUnreachable(f"{what} did not arrive whole within {deadline:.0f} s")
    if response.status_code >= 400:
        # huggingface_hub's own mapping of the status (and its error headers) to exceptions.
        hf_raise_for_status(
            type(response)(
                response.status_code,
                headers=response.headers,
                content=bytes(body),
                request=response.request,
            )
        )
    return bytes(body)
