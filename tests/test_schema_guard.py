"""A client's JSON schema is compiled in a process of its own, bounded in time and memory.

An `allOf` of regex patterns under 1 KB asks llguidance for seconds to minutes and
gigabytes (16 `\\p{L}*x` patterns: ~4 s and ~430 MB here; 18: past 1 GiB). Each is a clear
refusal within the bound, while this event loop keeps running. Real compiler processes: slow
tier.
"""

from __future__ import annotations

import json

import psutil
import pytest
import trio

from tests.waiting import NotYet, wait_until
from trexo.schema_guard import CHILD_MODULE, SchemaGuard, SchemaRefused

BOUND_S = 60.0
"""Generous: catches hangs only."""


def hostile(patterns: int) -> str:
    """An `allOf` of `patterns` regex patterns, each multiplying the lexer's states."""
    rules = [{"pattern": "\\p{L}*" + chr(ord("a") + k)} for k in range(patterns)]
    return json.dumps({"type": "string", "allOf": rules})


class Ticker:
    """Ticks every `interval` on this event loop: the largest gap shows whether it stalled."""

    def __init__(self, interval: float = 0.05) -> None:
        self.interval = interval
        self.largest_gap = 0.0

    async def run(self) -> None:
        last = trio.current_time()
        while True:
            await trio.sleep(self.interval)
            now = trio.current_time()
            self.largest_gap = max(self.largest_gap, now - last)
            last = now


async def test_a_good_schema_passes_and_a_broken_one_says_why() -> None:
    guard = SchemaGuard()
    with trio.fail_after(BOUND_S):
        await guard.check('{"type": "object", "properties": {"a": {"type": "string"}}}')
        with pytest.raises(SchemaRefused, match="Invalid type: nonsense"):
            await guard.check('{"type": "nonsense"}')


async def test_a_verdict_is_remembered(monkeypatch: pytest.MonkeyPatch) -> None:
    guard = SchemaGuard()
    with trio.fail_after(BOUND_S):
        await guard.check('{"type": "object"}')
        with pytest.raises(SchemaRefused):
            await guard.check('{"type": "nonsense"}')

        async def no_process(schema_json: str) -> str | None:
            raise AssertionError("compiled again")

        monkeypatch.setattr(guard, "_compile", no_process)
        await guard.check('{"type": "object"}')
        with pytest.raises(SchemaRefused, match="nonsense"):
            await guard.check('{"type": "nonsense"}')


async def test_a_schema_that_takes_too_long_is_refused_in_time_and_the_loop_runs_on() -> None:
    guard = SchemaGuard(cpu_seconds=1, memory_bytes=8 * 2**30)
    schema = hostile(16)  # ~4 s here
    assert len(schema) < 1024
    ticker = Ticker()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(ticker.run)
        with trio.fail_after(BOUND_S), pytest.raises(SchemaRefused, match="within 1 s of CPU time"):
            await guard.check(schema)
        nursery.cancel_scope.cancel()
    # A blocked loop would show the whole compile (seconds) as one gap.
    assert ticker.largest_gap < 2.0


async def test_a_schema_that_takes_too_much_memory_is_refused() -> None:
    guard = SchemaGuard(cpu_seconds=int(BOUND_S), memory_bytes=256 * 2**20)
    schema = hostile(18)
    assert len(schema) < 1024
    with trio.fail_after(BOUND_S * 2), pytest.raises(SchemaRefused, match="more than 256 MiB"):
        await guard.check(schema)


def compilers() -> list[psutil.Process]:
    return [
        child for child in psutil.Process().children() if CHILD_MODULE in " ".join(child.cmdline())
    ]


async def test_a_check_cancelled_midway_leaves_no_compiler_behind() -> None:
    guard = SchemaGuard(cpu_seconds=int(BOUND_S), memory_bytes=8 * 2**30)
    with trio.move_on_after(BOUND_S) as gave_up:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(guard.check, hostile(16))  # ~4 s here
            await wait_until(lambda: compilers() or NotYet([]), timeout=BOUND_S, what="a compiler")
            nursery.cancel_scope.cancel()  # as when its client leaves
    assert not gave_up.cancelled_caught
    assert compilers() == []  # killed and reaped
