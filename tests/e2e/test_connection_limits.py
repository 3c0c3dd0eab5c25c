"""Real nodes at their limits: thousands of connections past the cap, a process out of file
descriptors, and the `--cors-origin` option; the node must stay up and keep serving."""

from __future__ import annotations

import resource
import signal
from pathlib import Path

import httpx
import pytest
import trio
from api.raw_http import SLOW_BODY, host_port, parse_response, request_bytes

from tests.waiting import NotYet, holds_for, wait_until
from trexo.config import API_ACCEPT_RETRY_S

from .fd_hog_node import HOGGED, RELEASED
from .harness import TrexoProcess, run_trexo

NO_MODEL = ("--no-model",)
CAP = 300
CONNECTIONS = 2000
"""Held open at once by this test: `CAP` busy on the node, the rest refused."""
CONNECT_BATCH = 50
"""Connections opened at once: fewer than hypercorn's listen backlog (100), so none waits
for a SYN retransmission."""
PHASE_BOUND_S = 20.0
HOG_NODE = str(Path(__file__).with_name("fd_hog_node.py"))


def clean_log(node: TrexoProcess) -> str:
    log = node.log_text()
    assert "Traceback" not in log
    assert "crashed" not in log and "restarting session" not in log
    return log


async def wait_served(url: str, bound: float = 10.0) -> httpx.Response:
    """GET /health until it answers 200 (503s while the node lets go of old connections)."""
    async with httpx.AsyncClient(base_url=url, timeout=bound) as http:

        async def health_ok() -> httpx.Response | NotYet:
            response = await http.get("/health")
            return response if response.status_code == 200 else NotYet(response.text)

        answer: httpx.Response = await wait_until(health_ok, timeout=bound, what="/health 200")
        return answer


def accept_queue(port: int) -> int | None:
    """How many connections to `port` wait in the kernel for the listener to accept them
    (a listening socket's rx_queue in /proc/net/tcp); None if nothing listens there."""
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            local, state, queues = fields[1], fields[3], fields[4]
            if state == "0A" and int(local.rsplit(":", 1)[1], 16) == port:  # 0A: LISTEN
                return int(queues.split(":")[1], 16)
    return None


async def test_connections_past_the_cap_are_refused_and_the_node_survives(
    tmp_path: Path,
) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < CONNECTIONS + 200:
        pytest.skip(f"this test holds {CONNECTIONS} sockets; the fd hard limit is {hard}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, CONNECTIONS + 200), hard))
    try:
        async with run_trexo(tmp_path / "n", *NO_MODEL, "--api-max-connections", str(CAP)) as node:
            address = host_port(node.url)
            streams: list[trio.SocketStream] = []
            answers: dict[int, bytes] = {}

            async def connect() -> None:
                stream = await trio.open_tcp_stream(*address)
                await stream.send_all(SLOW_BODY)
                streams.append(stream)

            async def read_answer(k: int, stream: trio.SocketStream) -> None:
                data = b""
                while chunk := await stream.receive_some():
                    data += chunk
                answers[k] = data  # only the refused are answered (and closed)

            with trio.fail_after(PHASE_BOUND_S):
                async with trio.open_nursery() as readers:
                    for _ in range(0, CONNECTIONS, CONNECT_BATCH):
                        async with trio.open_nursery() as batch:
                            for _ in range(CONNECT_BATCH):
                                batch.start_soon(connect)
                    for k, stream in enumerate(streams):
                        readers.start_soon(read_answer, k, stream)
                    refused = CONNECTIONS - CAP
                    await wait_until(
                        lambda: len(answers) >= refused or NotYet(len(answers)),
                        timeout=PHASE_BOUND_S,
                        what=f"{refused} refusals",
                    )
                    await wait_until(
                        lambda: accept_queue(address[1]) == 0,
                        timeout=PHASE_BOUND_S,
                        what="every connection accepted by the node",
                    )
                    # And no more: the other connections are served. Every connection is
                    # accepted now, and a refusal is answered as soon as it is accepted (the
                    # others came in one burst); a served one waits for the rest of its body.
                    # So an answer more within 0.5 s would be a connection under the cap
                    # refused or dropped.
                    await holds_for(
                        lambda: len(answers) == refused or NotYet(len(answers)),
                        seconds=0.5,
                        what=f"only the {refused} over the cap answered",
                    )
                    assert node.process.returncode is None
                    readers.cancel_scope.cancel()
                for data in answers.values():
                    response = parse_response(data)
                    assert response.status == 503
                    assert response.headers["retry-after"] == "1"
                    assert response.json()["error"]["code"] == "too_many_connections"
                for stream in streams:
                    await stream.aclose()
                await wait_served(node.url)
            assert node.process.returncode is None
            assert "refused a connection with 503" in clean_log(node)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


async def test_a_node_out_of_file_descriptors_keeps_running(tmp_path: Path) -> None:
    async with run_trexo(tmp_path / "n", *NO_MODEL, entry=(HOG_NODE,)) as node:
        stdout = node.data_dir / "stdout.log"
        with trio.fail_after(PHASE_BOUND_S):
            node.process.send_signal(signal.SIGUSR1)
            await wait_until(lambda: HOGGED in stdout.read_text(), timeout=5.0, what="fds used up")
            waiting = await trio.open_tcp_stream(*host_port(node.url))  # queued, not accepted
            await waiting.send_all(request_bytes("GET", "/health", version="1.0"))
            # The worker re-reads /proc/meminfo every 5 s: that read fails now, and must not
            # end the session.
            await wait_until(
                lambda: "could not read this node's memory figures" in node.log_text(),
                timeout=12.0,
                what="the node report's read failing",
            )
            # Not answered while out of descriptors: queued since before that read failed
            # (seconds ago), and the listener retries `accept` every API_ACCEPT_RETRY_S, so
            # within twice that it must fail again at least once and leave the client queued.
            with trio.move_on_after(2 * API_ACCEPT_RETRY_S) as quiet:
                early = await waiting.receive_some()
            assert quiet.cancelled_caught, f"got {early!r} while out of descriptors"
            node.process.send_signal(signal.SIGUSR2)
            await wait_until(
                lambda: RELEASED in stdout.read_text(), timeout=5.0, what="fds released"
            )
            data = b""
            while chunk := await waiting.receive_some():
                data += chunk
            await waiting.aclose()
            assert parse_response(data).status == 200
            health = await wait_served(node.url)
            assert health.json()["status"] == "ok"
        assert node.process.returncode is None
        log = clean_log(node)
        assert "cannot accept connections: Too many open files (EMFILE)" in log
        assert "accepting connections again after" in log


async def test_cors_origin_and_allowed_host_options_reach_the_api(tmp_path: Path) -> None:
    app = "https://app.example"
    preflight = {
        "Origin": app,
        "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "content-type",
    }
    async with (
        run_trexo(tmp_path / "open", *NO_MODEL) as plain,
        run_trexo(
            tmp_path / "cors",
            *NO_MODEL,
            "--cors-origin",
            app + "/",
            "--api-allowed-host",
            "mybox.lan",
        ) as cors,
        httpx.AsyncClient(timeout=PHASE_BOUND_S) as http,
    ):
        with trio.fail_after(PHASE_BOUND_S):
            answer = await http.options(f"{cors.url}/v1/chat/completions", headers=preflight)
            assert answer.status_code == 204
            assert answer.headers["Access-Control-Allow-Origin"] == app
            assert answer.headers["Access-Control-Allow-Methods"] == "OPTIONS, POST"
            models = await http.get(f"{cors.url}/v1/models", headers={"Origin": app})
            assert models.headers["Access-Control-Allow-Origin"] == app
            other = await http.get(f"{cors.url}/v1/models", headers={"Origin": "https://x.example"})
            assert "access-control-allow-origin" not in other.headers
            assert other.status_code == 403  # and refused (`trexo.api.cross_site`)
            named = await http.get(f"{cors.url}/health", headers={"Host": "mybox.lan"})
            assert named.status_code == 200
            rebound = await http.get(f"{cors.url}/health", headers={"Host": "evil.example"})
            assert rebound.json()["error"]["code"] == "host_not_allowed"
            unnamed = await http.get(f"{plain.url}/health", headers={"Host": "mybox.lan"})
            assert unnamed.status_code == 403

            answer = await http.options(f"{plain.url}/v1/chat/completions", headers=preflight)
            assert answer.status_code == 204
            assert answer.headers["Allow"] == "OPTIONS, POST"
            assert "access-control-allow-origin" not in answer.headers
            models = await http.get(f"{plain.url}/v1/models", headers={"Origin": app})
            assert "access-control-allow-origin" not in models.headers
