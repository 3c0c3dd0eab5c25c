"""The `Idempotency-Key` header of `POST /instances` and `DELETE /instances/<id>`.

Every placement and deletion goes to the master under a key (see `trexo.idempotency`):
the client's, or one made up here. If no master answers in time the 503 names the key (in
its message and in the `Idempotency-Key` header): a retry with it is answered from the
first attempt if that was carried out after all, and carried out once if not.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from quart import request

from trexo.api.errors import SERVER_ERROR, ApiError
from trexo.errors import NoSession
from trexo.idempotency import IDEMPOTENCY_HEADER, parse_idempotency_key
from trexo.types.ids import new_id


def request_idempotency_key() -> str:
    """The request's key, or a fresh one; a malformed key is the client's 400."""
    try:
        key = parse_idempotency_key(request.headers.get(IDEMPOTENCY_HEADER))
    except ValueError as exc:
        raise ApiError(400, str(exc), param=IDEMPOTENCY_HEADER, code="invalid_header") from None
    return key if key is not None else new_id()


@contextmanager
def retry_under(key: str) -> Iterator[None]:
    """A `NoSession` inside becomes a 503 that tells the client to retry under `key`."""
    try:
        yield
    except NoSession as exc:
        raise ApiError(
            503,
            f"{exc} (it may still be carried out: retry with the header"
            f" '{IDEMPOTENCY_HEADER}: {key}' and it happens once)",
            type=SERVER_ERROR,
            code="no_session",
            retry_after_s=exc.retry_after_s,
            headers={IDEMPOTENCY_HEADER: key},
        ) from None
