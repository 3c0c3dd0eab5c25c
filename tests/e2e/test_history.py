"""Bounded history with real nodes: joiners catch up from a snapshot, a node killed
mid-snapshot loses nothing it broadcast, torn log tails are cut, old sessions pruned."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

import httpx
import openai
import trio

from tests.waiting import NotYet, wait_until
from trexo import wire
from trexo.master.session_store import read_newest_session, stored_sessions
from trexo.types.state import State

from .cluster import ClusterNode, open_cluster
from .harness import TrexoProcess, run_trexo, stop

MODEL = "trexo-demo-tiny"
TIMEOUT_S = 60.0


async def chat(url: str, text: str, max_tokens: int = 4) -> str:
    client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0)
    async with client:
        reply = await client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": text}],
            max_tokens=max_tokens,
            temperature=0,
        )
    return reply.choices[0].message.content or ""


async def chats(url: str, count: int, at_once: int = 4) -> None:
    """`count` short chats, `at_once` at a time: each adds a few events to the log."""
    limit = trio.CapacityLimiter(at_once)

    async def one(k: int) -> None:
        async with limit:
            await chat(url, f"question {k}", max_tokens=1)

    async with trio.open_nursery() as nursery:
        for k in range(count):
            nursery.start_soon(one, k)


async def get_json(url: str) -> Any:
    async with httpx.AsyncClient(timeout=TIMEOUT_S) as http:
        return (await http.get(url)).json()


async def history(node: ClusterNode | TrexoProcess) -> dict[str, Any]:
    health = await get_json(f"{node.url}/health")
    report: dict[str, Any] = health["history"]
    return report


async def test_a_joiner_after_many_requests_catches_up_from_a_snapshot_and_serves(
    tmp_path: Path,
) -> None:
    async with open_cluster(tmp_path) as cluster:
        first = await cluster.add("--snapshot-every", "20")
        with trio.fail_after(TIMEOUT_S * 2):
            await chats(first.url, 40)
            before = await history(first)
            assert before["snapshots_taken"] >= 3
            assert before["events_in_memory"] < 20
            joiner = await cluster.add("--no-model")
            await cluster.wait_converged(expect_nodes=2)

            async def snapshot_applied() -> bool | NotYet:
                report = await history(joiner)
                return report["snapshots_applied"] >= 1 or NotYet(report)

            await wait_until(snapshot_applied, timeout=TIMEOUT_S, what="the joiner's snapshot")
        assert "caught up from a snapshot" in joiner.process.log_text()  # type: ignore[union-attr]
        # The joiner serves: its request travels to the first node's runner and back.
        with trio.fail_after(TIMEOUT_S):
            via_joiner = await chat(joiner.url, "Explain the for statement.")
            via_first = await chat(first.url, "Explain the for statement.")
        assert via_joiner == via_first != ""


async def test_a_node_killed_mid_snapshot_restarts_with_nothing_lost(tmp_path: Path) -> None:
    data_dir = tmp_path / "node"
    events_dir = data_dir / "events"
    args = ("--snapshot-every", "10", "--test-snapshot-pause", "3")
    async with run_trexo(data_dir, *args) as node:
        with trio.fail_after(TIMEOUT_S * 2):
            # One snapshot completes; the node is killed while writing the next one.
            while not list(events_dir.glob("*/snapshot-*.json")):
                await chats(node.url, 2, at_once=2)
            async with trio.open_nursery() as load:
                load.start_soon(chats, node.url, 8, 2)
                await wait_until(
                    lambda: list(events_dir.glob("*/snapshot-*.json.tmp")),
                    timeout=TIMEOUT_S,
                    what="a snapshot being written",
                )
                load.cancel_scope.cancel()
            served = await wait_until(
                lambda: all_broadcast_applied(node), timeout=TIMEOUT_S, what="the view caught up"
            )
        os.kill(node.pid, signal.SIGKILL)
        await node.process.wait()
    stored = read_newest_session(events_dir)
    assert stored is not None
    assert stored.snapshot is not None and stored.snapshot.index < served["last_index"]
    assert json.loads(wire.to_json(stored.state, State)) == served
    # Restarted, the node keeps its placement and serves it.
    async with run_trexo(data_dir) as node:
        with trio.fail_after(TIMEOUT_S):
            assert await chat(node.url, "Explain the for statement.") != ""
            state = await get_json(f"{node.url}/state")
        assert set(state["instances"]) == set(served["instances"])
        assert "restored 1 instance(s)" in node.log_text()


async def all_broadcast_applied(node: TrexoProcess) -> dict[str, Any] | NotYet:
    """The node's `/state` once it shows every event its master broadcast: the master is
    blocked in writing a snapshot, which stands at the last event it broadcast."""
    report = await history(node)
    served: dict[str, Any] = await get_json(f"{node.url}/state")
    if served["last_index"] == report["snapshot_index"]:
        return served
    return NotYet({"applied": served["last_index"], "broadcast": report["snapshot_index"]})


async def test_a_torn_tail_is_cut_and_old_sessions_are_pruned(tmp_path: Path) -> None:
    data_dir = tmp_path / "node"
    events_dir = data_dir / "events"
    for restart in range(4):
        async with run_trexo(data_dir, "--keep-sessions", "2") as node:
            with trio.fail_after(TIMEOUT_S):
                assert await chat(node.url, "What is a generator?") != ""
            if restart == 1:
                assert "truncated last line" in node.log_text()
            await stop(node)
        sessions = stored_sessions(events_dir)
        assert 1 <= len(sessions) <= 2
        if restart == 0:
            # A crash mid-append leaves half a record: the next start cuts it.
            _, newest = sessions[-1]
            segment = max(newest.glob("events-*.jsonl"))
            with open(segment, "ab") as file:
                file.write(b'{"session":{"clock":')
    clocks = [session.clock for session, _ in stored_sessions(events_dir)]
    assert len(clocks) == 2 and clocks[0] < clocks[1]
