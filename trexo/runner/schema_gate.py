"""A request with a JSON schema reaches the compute thread only once its schema has passed.

The compute thread compiles a request's schema when the request joins the batch, and every
stream in the batch waits while it does: a hostile schema would hold them for minutes and
take gigabytes. So the runner's trio side first has the schema checked in a bounded process
(`trexo.schema_guard`, the same bound as on the API's node, which may be another node); a
refusal is that request's error alone. What passes compiles on the compute thread within
about the same bound, once per schema (compiled schemas are kept and copied).
"""

from __future__ import annotations

from collections.abc import Callable

import trio

from trexo.errors import Unavailable
from trexo.runner.compute import ComputeThread
from trexo.schema_guard import SchemaGuard, SchemaRefused
from trexo.types.failure import FailureKind
from trexo.types.generation import GenerationRequest
from trexo.types.ids import RequestId
from trexo.types.ipc import FromRunner, RequestFailed


class SchemaGate:
    """Hands requests to `compute`, those with a JSON schema once `guard` accepted it.

    Checks run in `nursery`; a cancel that comes while a request's schema is being checked
    takes effect as soon as the request reaches the compute thread."""

    def __init__(
        self,
        guard: SchemaGuard,
        compute: ComputeThread,
        post: Callable[[FromRunner], None],
        nursery: trio.Nursery,
    ) -> None:
        self._guard = guard
        self._compute = compute
        self._post = post
        self._nursery = nursery
        self._checking: set[RequestId] = set()
        self._cancelled: set[RequestId] = set()

    def submit(self, request: GenerationRequest) -> None:
        fmt = request.response_format
        if fmt is None or fmt.schema is None or self._compute.rank:  # rank > 0 refuses it
            self._compute.submit_generate(request)
            return
        self._checking.add(request.request_id)
        self._nursery.start_soon(self._check_then_submit, request, fmt.schema)

    def cancel(self, request_id: RequestId) -> None:
        if request_id in self._checking:
            self._cancelled.add(request_id)
        else:
            self._compute.cancel(request_id)

    async def _check_then_submit(self, request: GenerationRequest, schema: str) -> None:
        rid = request.request_id
        failure: RequestFailed | None = None
        try:
            await self._guard.check(schema)
        except SchemaRefused as exc:
            failure = RequestFailed(rid, str(exc), FailureKind.INVALID_REQUEST)
        except Unavailable as exc:
            failure = RequestFailed(rid, str(exc), FailureKind.UNAVAILABLE)
        finally:
            self._checking.discard(rid)
        cancelled = rid in self._cancelled
        self._cancelled.discard(rid)
        if failure is not None:
            self._post(failure)
            return
        self._compute.submit_generate(request)
        if cancelled:
            self._compute.cancel(rid)  # it ends as cancelled, the way a queued request does
