"""``Listening``: the SMTP listener on 127.0.0.1 port 0 over a temporary spool.

``start_listening(root, settings)`` (or the ``listening`` context manager)
makes the spool ``root/spool``, starts ``qmgrd.listener.start_listener`` with
an ``on_commit`` that records queue ids in ``commits``, and returns the handle
with the spool. ``close()`` stops it and waits (bounded) for every session.
``loopback_settings(**changes)`` are listener settings that bind 127.0.0.1
port 0 as ``mx.test`` with only 127.0.0.1 in ``mynetworks``.

``Chat`` is a raw SMTP client for dialogues a library client would not hold
(one line out, one possibly multi-line reply back); ``Listening.chat()`` opens
one that ``close()`` also closes.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import ipaddress
import os
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from qmgrd.listener import ListenerHandle, ListenerSettings, start_listener
from qmgrd.spool import QueueFile, Spool, read_content
from tests.support.waits import TIMEOUT

LOOPBACK_SETTINGS = ListenerSettings(
    listen=(("127.0.0.1", 0),),
    myhostname="mx.test",
    mynetworks=(ipaddress.ip_network("127.0.0.1/32"),),
    message_size_limit=100_000,
    smtpd_recipient_limit=3,
    smtpd_timeout=30,
)


def loopback_settings(**changes: Any) -> ListenerSettings:
    """``LOOPBACK_SETTINGS`` with ``changes`` applied (``dataclasses.replace``)."""
    return dataclasses.replace(LOOPBACK_SETTINGS, **changes)


class Chat:
    """A raw SMTP client: send one line, read one (possibly multi-line) reply, bounded."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Wrap an open connection (``Chat.open`` also reads the greeting)."""
        self.reader, self.writer = reader, writer

    @classmethod
    async def open(cls, host: str, port: int) -> tuple[Chat, str]:
        """Connect to ``host``:``port``; the chat and the server's greeting."""
        reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), TIMEOUT)
        chat = cls(reader, writer)
        return chat, await chat.reply()

    async def reply(self) -> str:
        """The next reply, its lines joined with newlines (the last one has no ``-``)."""
        lines: list[str] = []
        while True:
            line = (await asyncio.wait_for(self.reader.readline(), TIMEOUT)).decode()
            assert line, f"connection closed after {lines}"
            lines.append(line.rstrip("\r\n"))
            if line[3:4] != "-":
                return "\n".join(lines)

    async def cmd(self, line: str) -> str:
        """Send ``line`` (CRLF added; lone surrogates sent as the raw bytes) and read the reply."""
        self.writer.write(line.encode("utf-8", "surrogateescape") + b"\r\n")
        return await self.reply()

    async def closed(self) -> bool:
        """Whether the server closes the connection (reads to the end, bounded)."""
        return await asyncio.wait_for(self.reader.read(), TIMEOUT) == b""

    async def close(self) -> None:
        """Close our side."""
        self.writer.close()
        with contextlib.suppress(ConnectionError):
            await self.writer.wait_closed()


@dataclass(eq=False)
class Listening:
    """A running listener, its spool and the queue ids it committed."""

    handle: ListenerHandle
    spool: Spool
    commits: list[str] = field(default_factory=list)
    chats: list[Chat] = field(default_factory=list)

    @property
    def port(self) -> int:
        """The first bound port."""
        return self.handle.addresses[0][1]

    async def chat(self, host: str = "127.0.0.1") -> Chat:
        """A raw client connected from ``host``, past a 220 greeting; closed by ``close()``."""
        chat, greeting = await Chat.open(host, self.port)
        self.chats.append(chat)
        assert greeting.startswith("220 "), greeting
        return chat

    def ids(self) -> list[str]:
        """Queue ids in ``incoming/``."""
        return self.spool.list_ids("incoming")

    def only_file(self) -> QueueFile:
        """The one queue file in ``incoming/`` (asserts there is exactly one)."""
        ids = self.ids()
        assert len(ids) == 1, ids
        return self.spool.open("incoming", ids[0])

    def queued(self) -> dict[str, bytes]:
        """Every committed message in ``incoming/``: id -> content (each must parse)."""
        return {qid: read_content(self.spool.path("incoming", qid)) for qid in self.ids()}

    def temporaries(self) -> list[str]:
        """Names of temporary (uncommitted) files in ``incoming/``."""
        return [n for n in os.listdir(self.spool.root / "incoming") if n.startswith(".")]

    def clear(self) -> None:
        """Remove every queued message."""
        for qid in self.ids():
            self.spool.remove("incoming", qid)

    async def close(self) -> None:
        """Close our raw clients, stop listening and wait (bounded) for every session to end."""
        for chat in self.chats:
            await chat.close()
        self.handle.close()
        await asyncio.wait_for(self.handle.wait_closed(), TIMEOUT)


async def start_listening(
    root: Path,
    settings: ListenerSettings = LOOPBACK_SETTINGS,
    *,
    clock: Callable[[], float] = time.time,
    fsync: bool = False,
) -> Listening:
    """Start a listener for ``settings`` over the spool ``root/spool``."""
    spool = Spool(root / "spool", fsync=fsync)
    spool.ensure_dirs()
    commits: list[str] = []
    handle = await start_listener(
        settings, spool, on_commit=lambda c: commits.append(c.queue_id), clock=clock
    )
    return Listening(handle, spool, commits)


@contextlib.asynccontextmanager
async def listening(
    root: Path,
    settings: ListenerSettings = LOOPBACK_SETTINGS,
    *,
    clock: Callable[[], float] = time.time,
    fsync: bool = False,
) -> AsyncIterator[Listening]:
    """``start_listening`` as a context manager that always closes the listener."""
    srv = await start_listening(root, settings, clock=clock, fsync=fsync)
    try:
        yield srv
    finally:
        await srv.close()
