"""A TCP proxy on 127.0.0.1 that adds a fixed latency to every request.

This kernel has no netem, so S3's round trip is simulated here: on each
connection, when the client starts a new request (client bytes arrive after
the server has answered, or the connection is new), the proxy waits ``delay``
seconds before forwarding them. Bytes in the server->client direction pass
straight through. Each request therefore pays the delay exactly once, however
many packets it spans, and keep-alive connections are handled.

It counts the requests and the bytes it forwarded; a connection to STATS_PORT
gets "REQUESTS BYTES_DOWN BYTES_UP\n" back, so the bench can tell how many
requests each system made for a workload.

Run: python proxy.py LISTEN_PORT TARGET_PORT [DELAY_MS [STATS_PORT]]
(port 0: any free one; it prints "ready LISTEN_PORT [STATS_PORT]" once listening)
"""

from __future__ import annotations

import asyncio
import contextlib
import sys

BUF = 1 << 20
COUNTS = {"requests": 0, "down": 0, "up": 0}


class _Conn:
    __slots__ = ("new_request",)

    def __init__(self) -> None:
        self.new_request = True


async def _client_to_server(reader, writer, state: _Conn, delay: float) -> None:
    try:
        while True:
            data = await reader.read(BUF)
            if not data:
                break
            COUNTS["up"] += len(data)
            if state.new_request:
                state.new_request = False
                COUNTS["requests"] += 1
                await asyncio.sleep(delay)
            writer.write(data)
            await writer.drain()
    finally:
        with contextlib.suppress(Exception):
            writer.write_eof()


async def _server_to_client(reader, writer, state: _Conn) -> None:
    try:
        while True:
            data = await reader.read(BUF)
            if not data:
                break
            state.new_request = True
            COUNTS["down"] += len(data)
            writer.write(data)
            await writer.drain()
    finally:
        with contextlib.suppress(Exception):
            writer.close()


async def _handle(creader, cwriter, target_port: int, delay: float) -> None:
    try:
        sreader, swriter = await asyncio.open_connection("127.0.0.1", target_port)
    except OSError:
        cwriter.close()
        return
    state = _Conn()
    tasks = [
        asyncio.create_task(_client_to_server(creader, swriter, state, delay)),
        asyncio.create_task(_server_to_client(sreader, cwriter, state)),
    ]
    with contextlib.suppress(Exception):
        await asyncio.gather(*tasks, return_exceptions=True)
    for w in (swriter, cwriter):
        with contextlib.suppress(Exception):
            w.close()


async def _stats(_reader, writer) -> None:
    writer.write(f"{COUNTS['requests']} {COUNTS['down']} {COUNTS['up']}\n".encode())
    with contextlib.suppress(Exception):
        await writer.drain()
    writer.close()


async def serve(listen_port: int, target_port: int, delay: float, stats_port: int | None = None) -> None:
    """Listen (port 0: on a port the kernel picks) and print "ready PORT [STATS_PORT]", the
    ports bound, once listening: a port found free beforehand may be taken by someone's
    outgoing connection before the bind."""
    server = await asyncio.start_server(
        lambda r, w: _handle(r, w, target_port, delay), "127.0.0.1", listen_port,
        reuse_address=True, backlog=512)
    servers = [server]
    if stats_port is not None:
        servers.append(await asyncio.start_server(_stats, "127.0.0.1", stats_port, reuse_address=True))
    print("ready", *(s.sockets[0].getsockname()[1] for s in servers), flush=True)
    async with server:
        await server.serve_forever()


def main(argv: list[str]) -> None:
    listen_port, target_port = int(argv[0]), int(argv[1])
    delay = float(argv[2]) / 1000 if len(argv) > 2 else 0.020
    stats_port = int(argv[3]) if len(argv) > 3 else None
    asyncio.run(serve(listen_port, target_port, delay, stats_port))


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        main(sys.argv[1:])
