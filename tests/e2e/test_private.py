"""Private on the wire, with real `trexo run` processes: peer links through a relay the test
owns (it records every byte, tampers with a message, replays one), and the API with keys
over HTTPS (the official openai client and curl)."""

from __future__ import annotations

import contextlib
import json
import secrets
from collections.abc import Callable
from pathlib import Path

import httpx
import openai
import pytest
import trio
from tls_cert import make_self_signed
from wire_relay import WireRelay

from tests.waiting import NotYet, wait_answered, wait_until
from trexo.config import API_KEY_ENV

from .cluster import Cluster, ClusterNode, open_cluster
from .harness import run_trexo
from .test_cluster import MODEL, place, wait_instance_ready

TIMEOUT_S = 90.0
"""Generous: catches hangs only (a loaded 2-core machine)."""
RELINK_TIMEOUT_S = 30.0
CURL_TIMEOUT_S = 60.0
SECRET_ARGS = {"no secret": (), "secret": ("--cluster-secret", "s3cret")}


async def chat(node: ClusterNode, content: str, *, client: httpx.AsyncClient | None = None) -> str:
    api = openai.AsyncOpenAI(
        base_url=f"{node.url}/v1", api_key="x", max_retries=0, http_client=client
    )
    stream = await api.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": content}],
        max_tokens=8,
        stream=True,
    )
    text = ""
    async for chunk in stream:
        if chunk.choices:
            text += chunk.choices[0].delta.content or ""
    return text


async def chat_once_relinked(node: ClusterNode, content: str) -> str:
    """A chat through `node`, retried while the cluster links again and elects."""
    return await wait_answered(
        lambda: chat(node, content),
        retry_on=openai.APIError,
        timeout=RELINK_TIMEOUT_S,
        what=f"a chat through {node.name}",
        poll=0.2,
    )


def closed_links(*nodes: ClusterNode) -> int:
    """How many times these nodes closed a link over a message that failed to open."""
    return sum(n.process.log_text().count("failed authentication") for n in nodes if n.process)


async def poke(node: ClusterNode) -> None:
    """Make traffic on the link: a chat through A, to the model on B (it may fail)."""
    with trio.move_on_after(10), contextlib.suppress(openai.APIError):
        await chat(node, "poke")


async def spoil_a_message(
    a: ClusterNode, b: ClusterNode, relay: WireRelay, spoil: Callable[[], None], connections: int
) -> None:
    """`spoil()` the relay's next message; until a node closed the link over it and the
    relay carries its `connections`-th connection (the link made again)."""
    closed = closed_links(a, b)
    spoil()

    async def link_closed() -> bool:
        if closed_links(a, b) != closed:
            return True
        await poke(a)  # traffic for the relay to spoil
        return False

    await wait_until(link_closed, timeout=TIMEOUT_S, what="a link closed over the spoiled message")
    await wait_until(
        lambda: relay.connections >= connections or NotYet(relay.connections),
        timeout=RELINK_TIMEOUT_S,
        what=f"connection {connections} through the relay",
    )


async def pair_through_relay(
    cluster: Cluster, nursery: trio.Nursery, secret: tuple[str, ...]
) -> tuple[ClusterNode, ClusterNode, WireRelay]:
    """Node a, and node b that reaches a only through the relay; the model is placed on b."""
    a = await cluster.add("--no-model", *secret, peers=False)
    relay = WireRelay(a.peer_port)
    await nursery.start(relay.run)
    b = await cluster.add("--no-model", "--peer", f"127.0.0.1:{relay.port}", *secret, peers=False)
    await cluster.wait_converged(expect_nodes=2)
    await place(cluster, a, b)
    await wait_instance_ready(cluster, a)
    return a, b, relay


@pytest.mark.parametrize("secret", SECRET_ARGS.values(), ids=SECRET_ARGS.keys())
async def test_links_carry_no_prompt_in_clear_and_survive_tampering_and_replay(
    tmp_path: Path, secret: tuple[str, ...]
) -> None:
    async with open_cluster(tmp_path) as cluster, trio.open_nursery() as nursery:
        with trio.fail_after(TIMEOUT_S):
            a, b, relay = await pair_through_relay(cluster, nursery, secret)
            marker = f"MARKER-{secrets.token_hex(12)}"
            before = len(relay.recorded)
            assert await chat(a, f"Say {marker} back to me")  # A's API, B's runner
            assert len(relay.recorded) - before > len(marker)  # the request crossed the relay
            assert b'"type":"Hello"' in relay.recorded  # the relay records what is in clear
            assert marker.encode() not in relay.recorded
            assert b"ChatCompletion" not in relay.recorded and b"Generate" not in relay.recorded

        spoilers = (("tamper", relay.tamper_next, 2), ("replay", relay.replay_next, 3))
        for attack, spoil, connections in spoilers:
            await spoil_a_message(a, b, relay, spoil, connections)
            await cluster.wait_converged(expect_nodes=2, timeout=RELINK_TIMEOUT_S)
            assert await chat_once_relinked(a, f"{attack} {marker}")
        assert (relay.tampered, relay.replayed) == (1, 1)
        assert marker.encode() not in relay.recorded
        assert a.alive and b.alive
        nursery.cancel_scope.cancel()


KEY = "sk-trexo-" + secrets.token_hex(8)
ENV_KEY = "sk-trexo-env-" + secrets.token_hex(8)


async def curl(*args: str) -> tuple[int, str]:
    """`curl ARGS`: the HTTP status and the body."""
    result = await trio.run_process(
        ["curl", "-sS", "--max-time", str(CURL_TIMEOUT_S), "-w", "\n%{http_code}", *args],
        capture_stdout=True,
        capture_stderr=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    body, _, status = result.stdout.decode().rpartition("\n")
    return int(status), body


async def test_the_api_with_keys_over_https_for_openai_and_curl(tmp_path: Path) -> None:
    tls = make_self_signed(tmp_path / "tls")
    args = ("--api-key", KEY, "--api-tls-cert", str(tls.cert), "--api-tls-key", str(tls.key))
    node_dir = tmp_path / "node"
    async with run_trexo(node_dir, *args, env={API_KEY_ENV: ENV_KEY}) as node:
        url = node.url
        assert url.startswith("https://127.0.0.1:")
        with trio.fail_after(TIMEOUT_S):
            async with httpx.AsyncClient(verify=tls.client_context(), timeout=30) as https:
                for key in ("sk-wrong", KEY, ENV_KEY):
                    client = openai.AsyncOpenAI(
                        base_url=f"{url}/v1", api_key=key, max_retries=0, http_client=https
                    )
                    if key == "sk-wrong":
                        with pytest.raises(openai.AuthenticationError) as info:
                            await client.models.list()
                        assert info.value.code == "invalid_api_key"
                        continue
                    reply = await client.chat.completions.create(
                        model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=4
                    )
                    assert reply.choices[0].message.content is not None
                assert (await https.get(f"{url}/v1/models")).status_code == 401  # no key
                assert (await https.get(f"{url}/health")).status_code == 200

            cacert = ("--cacert", str(tls.cert))
            body = json.dumps(
                {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
            )
            post = ("-H", "Content-Type: application/json", "-d", body)
            chat_url = f"{url}/v1/chat/completions"
            status, text = await curl(*cacert, *post, chat_url)
            assert status == 401 and json.loads(text)["error"]["code"] == "invalid_api_key"
            status, _ = await curl(*cacert, *post, "-H", "Authorization: Bearer sk-no", chat_url)
            assert status == 401
            status, text = await curl(
                *cacert, *post, "-H", f"Authorization: Bearer {KEY}", chat_url
            )
            assert status == 200 and json.loads(text)["choices"][0]["message"]["content"]
            status, _ = await curl(*cacert, f"{url}/health")
            assert status == 200
            status, text = await curl(*cacert, "-H", f"x-api-key: {KEY}", f"{url}/state")
            assert status == 200
            assert KEY not in text and ENV_KEY not in text

    out = (node_dir / "stdout.log").read_text() + (node_dir / "node.log").read_text()
    assert KEY not in out and ENV_KEY not in out
    assert "Authorization: Bearer YOUR_API_KEY" in out  # the ready line's curl says where
