"""Hypercorn's trio worker never closes an HTTP/1.0 or `Connection: close` connection
served by a quart-trio app. Run: python hypercorn_connection_close_repro.py"""

import trio
from hypercorn.config import Config
from hypercorn.trio import serve
from quart_trio import QuartTrio

app = QuartTrio(__name__)


@app.get("/")
async def index() -> str:
    return "hello"


async def request(port: int, head: bytes) -> None:
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    await stream.send_all(head)
    received = b""
    with trio.move_on_after(3) as waited:
        while data := await stream.receive_some():
            received += data
    outcome = "HANGS: no EOF after 3 s" if waited.cancelled_caught else "closed by the server"
    print(f"{head.splitlines()[0].decode()!r:22} {received.splitlines()[0]!r}: {outcome}")
    await stream.aclose()


async def main() -> None:
    config = Config()
    config.bind = ["127.0.0.1:0"]
    async with trio.open_nursery() as nursery:
        [bind] = await nursery.start(serve, app, config)
        port = int(bind.rsplit(":", 1)[1])
        await request(port, b"GET / HTTP/1.0\r\n\r\n")
        await request(port, b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        nursery.cancel_scope.cancel()


trio.run(main)
