"""Separate `trexo run` processes on loopback (static peers, isolated data dirs) as one cluster."""

from __future__ import annotations

import os
import signal
import socket
from pathlib import Path
from typing import Any

import openai
import psutil
import trio

from tests.waiting import NotYet, wait_until
from trexo.runner.hooks import HOOKS_ENV

from .cluster import Cluster, ClusterNode, open_cluster
from .harness import stop

MODEL = "trexo-demo-tiny"
MESSAGES = [{"role": "user", "content": "What is a generator?"}]
TIMEOUT_S = 60.0
FAILOVER_BOUND_S = 15.0
"""Generous: catches hangs only; bench-election measures the real figures."""
KILL_CYCLES = 6
"""Each cycle kills the master, so the master moves every cycle and each node is killed and
restarted in turn while the others live through the swaps with the model loaded. What the
test catches — a process or a traceback left by a swap, descriptors that grow with each
swap a node lives through — shows within a few swaps; six give every node process a chance
to live through two or more. Long runs of kills are bench-election's (`-k`)."""
FD_SLACK = 4
"""Descriptors a node may hold more after some swaps than before them: a link or an HTTP
connection still closing when it is counted."""


async def master_of(cluster: Cluster) -> ClusterNode:
    session = await cluster.wait_converged()
    return cluster.by_id(session["master_id"])


async def wait_new_master(cluster: Cluster, old_master_id: str) -> dict[str, object]:
    async def new_session() -> dict[str, object] | NotYet:
        session = await cluster.wait_converged(timeout=FAILOVER_BOUND_S)
        return session if session["master_id"] != old_master_id else NotYet(session)

    return await wait_until(
        new_session, timeout=FAILOVER_BOUND_S, what=f"a master other than {old_master_id}"
    )


async def place(cluster: Cluster, via: ClusterNode, node: ClusterNode) -> str:
    response = await cluster.http.post(
        f"{via.url}/instances", json={"model": MODEL, "node_id": node.node_id}
    )
    assert response.status_code == 201, response.text
    instance_id: str = response.json()["instance_id"]
    return instance_id


async def wait_instance_ready(cluster: Cluster, node: ClusterNode) -> None:
    async def runner_ready() -> bool | NotYet:
        state = (await cluster.http.get(f"{node.url}/state")).json()
        statuses = [r["status"]["type"] for r in state["runners"].values()]
        return "RunnerReady" in statuses or NotYet(statuses)

    await wait_until(runner_ready, timeout=TIMEOUT_S, what=f"a runner ready, seen by {node.name}")


async def wait_same_state(cluster: Cluster, nodes: list[ClusterNode]) -> list[dict[str, Any]]:
    """The `/state` of each of `nodes`, once they are all the same."""

    async def same_state() -> list[dict[str, Any]] | NotYet:
        states = [(await cluster.http.get(f"{n.url}/state")).json() for n in nodes]
        if all(s == states[0] for s in states):
            return states
        # What differs from the first node's, by node: enough to see what lags.
        return NotYet([sorted(k for k in s if s[k] != states[0].get(k)) for s in states])

    return await wait_until(
        same_state, timeout=TIMEOUT_S, what=f"one state on {[n.name for n in nodes]}"
    )


async def greedy_text(node: ClusterNode, **extra: object) -> str:
    client = openai.AsyncOpenAI(base_url=f"{node.url}/v1", api_key="x", max_retries=0)
    text = ""
    stream = await client.chat.completions.create(
        model=MODEL,
        messages=MESSAGES,
        max_tokens=20,
        stream=True,
        **extra,  # type: ignore[arg-type]
    )
    async for chunk in stream:
        if chunk.choices:
            text += chunk.choices[0].delta.content or ""
    return text


async def test_three_nodes_converge_on_one_master_and_agree_on_state(tmp_path: Path) -> None:
    async with open_cluster(tmp_path) as cluster:
        await cluster.add_many(3, "--no-model")
        session = await cluster.wait_converged(expect_nodes=3)
        masters = [h for n in cluster.nodes if (h := await cluster.health(n)) and h["is_master"]]
        assert len(masters) == 1
        assert masters[0]["node_id"] == session["master_id"]
        states = await wait_same_state(cluster, cluster.nodes)
        assert set(states[0]["nodes"]) == {n.node_id for n in cluster.nodes}


async def test_sigkill_of_the_master_elects_a_new_one_that_takes_commands(tmp_path: Path) -> None:
    async with open_cluster(tmp_path) as cluster:
        await cluster.add_many(3, "--no-model")
        master = await master_of(cluster)
        old = master.node_id
        assert master.process is not None
        os.kill(master.process.pid, signal.SIGKILL)
        await master.process.process.wait()
        session = await wait_new_master(cluster, old)
        survivor = cluster.live()[0]
        assert session["master_id"] in {n.node_id for n in cluster.live()}
        state = (await cluster.http.get(f"{survivor.url}/state")).json()
        assert old not in state["nodes"]
        instance_id = await place(cluster, survivor, cluster.live()[-1])
        assert instance_id


async def test_a_frozen_master_is_replaced_and_demotes_itself_on_return(tmp_path: Path) -> None:
    async with open_cluster(tmp_path) as cluster:
        await cluster.add_many(3, "--no-model")
        master = await master_of(cluster)
        old = master.node_id
        assert master.process is not None
        os.kill(master.process.pid, signal.SIGSTOP)
        try:
            others = [n for n in cluster.nodes if n is not master]

            async def others_agree_on_a_new_master() -> bool | NotYet:
                healths = [await cluster.health(n) for n in others]
                masters = {h["session"]["master_id"] for h in healths if h and h["session"]}
                return (
                    len(masters) == 1
                    and old not in masters
                    and all(h and h["session"] for h in healths)
                ) or NotYet(masters)

            await wait_until(
                others_agree_on_a_new_master,
                timeout=FAILOVER_BOUND_S,
                what=f"the others agreeing on a master other than the frozen {old}",
            )
        finally:
            os.kill(master.process.pid, signal.SIGCONT)
        session = await cluster.wait_converged(expect_nodes=3)
        assert session["master_id"] != old
        healths = [await cluster.health(n) for n in cluster.nodes]
        assert sum(1 for h in healths if h and h["is_master"]) == 1


async def test_a_fourth_node_joining_does_not_change_the_master(tmp_path: Path) -> None:
    async with open_cluster(tmp_path) as cluster:
        await cluster.add_many(3, "--no-model")
        before = await cluster.wait_converged(expect_nodes=3)
        await cluster.add("--no-model")
        after = await cluster.wait_converged(expect_nodes=4)
        assert after == before


async def test_a_model_placed_on_one_node_is_served_through_another(tmp_path: Path) -> None:
    async with open_cluster(tmp_path) as cluster:
        a = await cluster.add("--no-model")
        b = await cluster.add("--no-model")
        await cluster.wait_converged(expect_nodes=2)
        await place(cluster, a, b)
        await wait_instance_ready(cluster, a)
        with trio.fail_after(TIMEOUT_S):
            through_a = await greedy_text(a)
            through_b = await greedy_text(b)
        assert through_a == through_b
        assert through_a


async def stream_text(node: ClusterNode, max_tokens: int, on_first: object = None) -> str:
    """Stream a greedy chat through `node`; call `on_first()` (async) at the first text."""
    client = openai.AsyncOpenAI(base_url=f"{node.url}/v1", api_key="x", max_retries=0)
    stream = await client.chat.completions.create(
        model=MODEL,
        messages=MESSAGES,
        max_tokens=max_tokens,
        stream=True,  # type: ignore[arg-type]
    )
    text = ""
    async for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            if not text and on_first is not None:
                await on_first()  # type: ignore[operator]
            text += chunk.choices[0].delta.content
    return text


async def test_a_master_failover_keeps_the_loaded_runner_and_its_stream(tmp_path: Path) -> None:
    async with open_cluster(tmp_path) as cluster:
        slow = {HOOKS_ENV: "step_delay=0.01"}
        await cluster.add_many(3, "--no-model", env=slow)
        master = await master_of(cluster)
        worker = next(n for n in cluster.nodes if n is not master)
        entry = next(n for n in cluster.nodes if n is not master and n is not worker)
        await place(cluster, entry, worker)
        await wait_instance_ready(cluster, entry)
        assert worker.process is not None and master.process is not None
        runners = worker.process.runner_pids()
        assert runners
        with trio.fail_after(TIMEOUT_S):
            undisturbed = await stream_text(entry, 200)

            async def kill_master() -> None:
                assert master.process is not None
                os.kill(master.process.pid, signal.SIGKILL)

            # 200 tokens at >= 10 ms each: the master dies early in the stream.
            text = await stream_text(entry, 200, on_first=kill_master)
        assert text == undisturbed  # no error, and not a token lost or repeated
        await wait_new_master(cluster, master.node_id)
        assert worker.process.runner_pids() == runners  # the model stayed loaded
        with trio.fail_after(TIMEOUT_S):
            served = await greedy_text(entry)  # the next request, through the new master
        assert served and undisturbed.startswith(served)
        log = worker.process.log_text()
        assert "Traceback" not in log, log[-3000:]


async def test_a_swap_while_a_runner_loads_does_not_wait_for_the_load(tmp_path: Path) -> None:
    async with open_cluster(tmp_path) as cluster:
        await cluster.add("--no-model", "--force-master")
        worker = await cluster.add("--no-model", env={HOOKS_ENV: "load_delay=4"})
        master = await master_of(cluster)
        assert master is not worker and worker.process is not None
        await cluster.wait_converged(expect_nodes=2)
        await place(cluster, worker, worker)

        async def loading() -> bool:
            return '"RunnerLoading"' in (await cluster.http.get(f"{worker.url}/state")).text

        await wait_until(loading, timeout=TIMEOUT_S, what="the runner loading")
        runners = worker.process.runner_pids()
        assert master.process is not None
        os.kill(master.process.pid, signal.SIGKILL)
        killed = trio.current_time()
        # The worker's new session starts while its runner is still loading (4 s).

        async def worker_is_master() -> bool:
            return bool((h := await cluster.health(worker)) and h["is_master"])

        # Polled every 10 ms: the time measured below is the election's, not the poll's.
        await wait_until(
            worker_is_master, timeout=FAILOVER_BOUND_S, what="the worker master", poll=0.01
        )
        assert trio.current_time() - killed < 2.0
        with trio.fail_after(TIMEOUT_S):
            await wait_instance_ready(cluster, worker)
            assert await greedy_text(worker)
        assert worker.process.runner_pids() == runners  # the load was not started over


async def test_a_killed_nodes_instance_is_placed_again_on_a_survivor(tmp_path: Path) -> None:
    async with open_cluster(tmp_path) as cluster:
        await cluster.add_many(3, "--no-model")
        master = await master_of(cluster)
        host = next(n for n in cluster.nodes if n is not master)
        entry = next(n for n in cluster.nodes if n is not master and n is not host)
        await place(cluster, entry, host)
        await wait_instance_ready(cluster, entry)
        assert host.process is not None
        os.kill(host.process.pid, signal.SIGKILL)

        async def placed_again() -> set[str] | NotYet:
            state = (await cluster.http.get(f"{entry.url}/state")).json()
            placed_on = {
                a["node_id"]
                for i in state["instances"].values()
                for a in i["assignments"]
                if i["model"]["model_id"] == MODEL
            }
            ready = any(r["status"]["type"] == "RunnerReady" for r in state["runners"].values())
            if placed_on and host.node_id not in placed_on and ready:
                return placed_on
            return NotYet({"placed_on": placed_on, "ready": ready})

        placed_on = await wait_until(
            placed_again, timeout=TIMEOUT_S, what=f"{MODEL} ready on a node other than the killed"
        )
        with trio.fail_after(TIMEOUT_S):
            assert await greedy_text(entry)
        assert placed_on <= {master.node_id, entry.node_id}


async def test_master_kills_with_a_loaded_model_leak_nothing(tmp_path: Path) -> None:
    async with open_cluster(tmp_path) as cluster:
        await cluster.add_many(3, "--no-model")
        await cluster.wait_converged(expect_nodes=3)
        first = await master_of(cluster)
        host = next(n for n in cluster.nodes if n is not first)
        await place(cluster, host, host)
        await wait_instance_ready(cluster, host)
        fds: dict[int, list[int]] = {}  # a node process's descriptors after each swap it saw
        for _ in range(KILL_CYCLES):
            master = await master_of(cluster)
            assert master.process is not None
            os.kill(master.process.pid, signal.SIGKILL)
            await cluster.stop(master)
            await wait_new_master(cluster, master.node_id)
            await cluster.start(master)
            await cluster.wait_converged(expect_nodes=3)
            for node in cluster.live():
                assert node.process is not None
                fds.setdefault(node.process.pid, []).append(
                    psutil.Process(node.process.pid).num_fds()
                )
        # The model (kept, or placed again when its host was the master) still serves.
        survivor = next(n for n in cluster.nodes if n.alive)
        await wait_instance_ready(cluster, survivor)
        with trio.fail_after(TIMEOUT_S):
            assert await greedy_text(survivor)
        lived_through_swaps = {pid: counts for pid, counts in fds.items() if len(counts) >= 3}
        assert lived_through_swaps, fds
        for pid, counts in lived_through_swaps.items():
            assert counts[-1] <= counts[0] + FD_SLACK, (pid, counts)
        for node in cluster.nodes:
            assert node.process is not None
            log = node.process.log_text()
            assert "Traceback" not in log, log[-3000:]


async def test_peers_with_the_wrong_namespace_or_secret_are_refused(tmp_path: Path) -> None:
    async with open_cluster(tmp_path) as cluster:
        seed = await cluster.add("--no-model", "--cluster-secret", "s3cret")
        stranger = await cluster.add(
            "--no-model", "--namespace", "elsewhere", "--cluster-secret", "s3cret"
        )
        impostor = await cluster.add("--no-model", "--cluster-secret", "wrong")
        friend = await cluster.add("--no-model", "--cluster-secret", "s3cret")

        async def seed_has_a_peer() -> bool | NotYet:
            health = await cluster.health(seed)
            return (health is not None and health["nodes"] >= 2) or NotYet(health)

        await wait_until(seed_has_a_peer, timeout=TIMEOUT_S, what="the seed joined by its friend")
        assert (
            seed.process is not None
            and stranger.process is not None
            and impostor.process is not None
        )

        def refusals_logged() -> bool:
            log = seed.process.log_text()  # type: ignore[union-attr]
            return (
                "namespace" in log
                and "elsewhere" in log
                and ("secret" in log or "HMAC" in log)
                and "namespace" in stranger.process.log_text()  # type: ignore[union-attr]
            )

        await wait_until(refusals_logged, timeout=TIMEOUT_S, what="both refusals logged")
        seen = set((await cluster.http.get(f"{seed.url}/state")).json()["nodes"])
        assert seen == {seed.node_id, friend.node_id}


async def test_garbage_on_the_peer_port_is_dropped_and_the_node_keeps_working(
    tmp_path: Path,
) -> None:
    async with open_cluster(tmp_path) as cluster:
        node = await cluster.add("--no-model")
        for payload in (b"\x00\xff" * 5000, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", os.urandom(4096)):
            with socket.create_connection(("127.0.0.1", node.peer_port), timeout=5) as sock:
                sock.sendall(payload)
        peer = await cluster.add("--no-model")
        await cluster.wait_converged(expect_nodes=2)
        assert (await cluster.health(node)) is not None
        assert peer.alive and node.alive


async def test_sigint_with_peers_exits_cleanly(tmp_path: Path) -> None:
    async with open_cluster(tmp_path) as cluster:
        a = await cluster.add("--no-model")
        await cluster.add("--no-model")
        await cluster.wait_converged(expect_nodes=2)
        assert a.process is not None
        await stop(a.process, signal.SIGINT)
        assert a.process.process.returncode == 0
        await cluster.wait_converged(expect_nodes=1)


async def test_three_nodes_with_the_default_model_place_it_once(tmp_path: Path) -> None:
    async with open_cluster(tmp_path) as cluster:
        await cluster.add_many(3)
        await cluster.wait_converged(expect_nodes=3)
        state = (await cluster.http.get(f"{cluster.nodes[-1].url}/state")).json()
        assert len(state["instances"]) == 1
        texts = [await greedy_text(n) for n in cluster.nodes]
        assert texts[0] and texts == [texts[0]] * 3


async def test_a_node_joining_mid_session_catches_up_from_the_log(tmp_path: Path) -> None:
    async with open_cluster(tmp_path) as cluster:
        a = await cluster.add("--no-model")
        b = await cluster.add("--no-model")
        await cluster.wait_converged(expect_nodes=2)
        await place(cluster, a, b)
        await wait_instance_ready(cluster, a)
        late = await cluster.add("--no-model")
        await cluster.wait_converged(expect_nodes=3)
        states = await wait_same_state(cluster, [a, late])
        assert len(states[1]["instances"]) == 1
        assert await greedy_text(late) == await greedy_text(a)
