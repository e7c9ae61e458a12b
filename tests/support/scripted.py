"""Scripted SMTP servers for the delivery agent's tests, on raw asyncio streams.

- ``scripted(handler)``: serve ``handler(reader, writer)`` per connection on
  127.0.0.1 port 0 (``Scripted``: the port, the nexthop, connections seen);
  every handler task is cancelled and awaited at exit.
- ``read_line`` (one command, upper-cased), ``play_until`` (a well-behaved
  server, PIPELINING offered, until a given verb), ``wait_forever``.
- ``FAST``: client settings with every SMTP timeout at ``T`` (half a second),
  and ``deliver_once``: one delivery with a fresh agent, bounded and closed.
- ``open_fds``: descriptors of this process (the ``no_leaks`` fixture).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

from qmgrd.delivery.agent import DeliveryResult
from qmgrd.delivery.settings import SmtpSettings
from qmgrd.delivery.smtp import SmtpAgent
from tests.integration.sinks import make_request

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]
T = 0.5  # every SMTP timeout in these tests: a stalled server costs half a second
FAST = SmtpSettings(
    helo_name="client.test",
    connect_timeout=T,
    helo_timeout=T,
    starttls_timeout=T,
    mail_timeout=T,
    rcpt_timeout=T,
    data_init_timeout=T,
    data_xfer_timeout=T,
    data_done_timeout=T,
    rset_timeout=T,
    quit_timeout=T,
    dns_timeout=1.0,
    connection_cache_on_demand=False,
)


@dataclass
class Scripted:
    """A running scripted server: its port and how many connections it accepted."""

    port: int
    connections: int = 0

    @property
    def nexthop(self) -> str:
        return f"[127.0.0.1]:{self.port}"


@contextlib.asynccontextmanager
async def scripted(handler: Handler) -> AsyncIterator[Scripted]:
    """Serve ``handler`` per connection; every handler task is cancelled and awaited at exit."""
    tasks: set[asyncio.Task[None]] = set()
    state = Scripted(0)

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        state.connections += 1
        task = asyncio.current_task()
        assert task is not None
        tasks.add(task)
        try:
            await handler(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError):
            # Cancelled at exit: end normally, so asyncio's stream callback has nothing to report.
            pass
        finally:
            writer.close()
            tasks.discard(task)

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    state.port = server.sockets[0].getsockname()[1]
    try:
        yield state
    finally:
        server.close()
        for task in list(tasks):
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await server.wait_closed()


async def read_line(reader: asyncio.StreamReader) -> bytes:
    """One command line from the client, without its line ending, upper-cased."""
    line = await reader.readline()
    if not line:
        raise ConnectionResetError("client went away")
    return line.rstrip(b"\r\n").upper()


async def play_until(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, stop: bytes
) -> None:
    """Play a well-behaved server until the client sends ``stop`` (a command verb)."""
    while True:
        cmd = await read_line(reader)
        if cmd.startswith(stop):
            return
        if cmd.startswith(b"EHLO"):
            writer.write(b"250-mx.test\r\n250 PIPELINING\r\n")
        elif cmd.startswith(b"QUIT"):
            writer.write(b"221 bye\r\n")
            return
        else:
            writer.write(b"250 2.0.0 ok\r\n")
        await writer.drain()


async def wait_forever() -> None:
    """Block until cancelled (a server that stops answering)."""
    await asyncio.Event().wait()


def open_fds() -> int:
    """How many file descriptors this process has open."""
    return len(os.listdir("/proc/self/fd"))


async def deliver_once(
    nexthop: str, settings: SmtpSettings = FAST, rcpts: tuple[str, ...] = ("r@dst.test",)
) -> DeliveryResult:
    """One delivery with a fresh agent, closed afterwards; bounded by a generous timeout."""
    agent = SmtpAgent(settings)
    try:
        return await asyncio.wait_for(agent.deliver(make_request(nexthop, list(rcpts))), 30)
    finally:
        await agent.close()
