"""The runner lets a request with a JSON schema compute only once the schema passed its
bounded check; a refusal is that request's error alone."""

from __future__ import annotations

import trio
from trio.testing import wait_all_tasks_blocked

from trexo.errors import Unavailable
from trexo.runner.schema_gate import SchemaGate
from trexo.schema_guard import SchemaRefused
from trexo.types.failure import FailureKind
from trexo.types.generation import ChatMessage, GenerationRequest, ResponseFormat
from trexo.types.ids import RequestId
from trexo.types.ipc import FromRunner, RequestFailed

HOSTILE = '{"allOf": "stands for a schema that explodes"}'
BUSY = '{"stands for": "no compiler to be had"}'
SLOW = '{"stands for": "a schema that takes a while"}'


class FakeGuard:
    def __init__(self) -> None:
        self.slow_done = trio.Event()

    async def check(self, schema_json: str) -> None:
        await trio.lowlevel.checkpoint()
        if schema_json == HOSTILE:
            raise SchemaRefused("the JSON schema is too complex")
        if schema_json == BUSY:
            raise Unavailable("retry")
        if schema_json == SLOW:
            await self.slow_done.wait()


class FakeCompute:
    rank: int | None = None

    def __init__(self) -> None:
        self.calls: list[tuple[str, RequestId]] = []

    def submit_generate(self, request: GenerationRequest) -> None:
        self.calls.append(("submit", request.request_id))

    def cancel(self, request_id: RequestId) -> None:
        self.calls.append(("cancel", request_id))


def request(rid: str, schema: str | None) -> GenerationRequest:
    fmt = ResponseFormat("json_schema", schema) if schema is not None else None
    return GenerationRequest(
        RequestId(rid), messages=(ChatMessage("user", "hi"),), response_format=fmt
    )


async def test_only_requests_whose_schema_passed_reach_the_compute_thread() -> None:
    compute, posted, guard = FakeCompute(), list[FromRunner](), FakeGuard()
    async with trio.open_nursery() as nursery:
        gate = SchemaGate(guard, compute, posted.append, nursery)  # type: ignore[arg-type]
        gate.submit(request("plain", None))
        gate.submit(request("good", '{"type": "object"}'))
        gate.submit(request("hostile", HOSTILE))
        gate.submit(request("busy", BUSY))
    # Checks run side by side: their outcomes come in any order.
    assert sorted(compute.calls) == [("submit", RequestId("good")), ("submit", RequestId("plain"))]
    assert {failure.request_id: failure for failure in posted} == {  # type: ignore[union-attr]
        RequestId("hostile"): RequestFailed(
            RequestId("hostile"), "the JSON schema is too complex", FailureKind.INVALID_REQUEST
        ),
        RequestId("busy"): RequestFailed(RequestId("busy"), "retry", FailureKind.UNAVAILABLE),
    }


async def test_a_cancel_during_the_check_takes_effect_once_it_is_submitted() -> None:
    compute, posted, guard = FakeCompute(), list[FromRunner](), FakeGuard()
    async with trio.open_nursery() as nursery:
        gate = SchemaGate(guard, compute, posted.append, nursery)  # type: ignore[arg-type]
        gate.submit(request("slow", SLOW))
        await wait_all_tasks_blocked()
        gate.cancel(RequestId("slow"))
        assert compute.calls == []
        guard.slow_done.set()
    assert compute.calls == [("submit", RequestId("slow")), ("cancel", RequestId("slow"))]
    assert posted == []
