"""SMTP sinks in a process of their own, for tests that kill the daemon (``test_crash``).

Run as ``python tests/integration/sinkproc.py LOG N``: binds N sinks on
127.0.0.1 (ports chosen by the OS), prints ``READY port1 port2 ...`` on stdout,
then serves until SIGTERM. For every accepted message it appends one line per
recipient, ``<time> <message-id> <recipient>``, to LOG with a single
``os.write`` on an ``O_APPEND`` descriptor (whole lines, in order, and on disk
in the page cache before the 250 is sent), so the killer test can compare
deliveries with what the daemon acknowledged.

A recipient whose local part starts with ``later`` is answered ``450 4.2.0``
at RCPT the first time it is offered (tests make such addresses unique per
message), and accepted after that: it makes the daemon write defer logs and
move the message to ``deferred/``.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import sys
import time
from typing import Any

from aiosmtpd.smtp import SMTP, Envelope, Session

_MESSAGE_ID = re.compile(rb"^Message-ID:\s*(\S+)", re.IGNORECASE | re.MULTILINE)


class _Handler:
    """Record every delivered (message-id, recipient); defer ``later*`` once per message."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.deferred_once: set[str] = set()  # "later" addresses answered 450 once

    async def handle_RCPT(
        self, server: Any, session: Session, envelope: Envelope, address: str, options: list[str]
    ) -> str:
        envelope.rcpt_tos.append(address)
        return "250 2.1.5 Ok"

    async def handle_DATA(self, server: Any, session: Session, envelope: Envelope) -> str:
        content = envelope.original_content or envelope.content or b""
        assert isinstance(content, bytes)
        match = _MESSAGE_ID.search(content.split(b"\r\n\r\n", 1)[0])
        msgid = match.group(1).decode() if match else "<none>"
        now = time.time()
        lines = "".join(f"{now:.6f} {msgid} {rcpt}\n" for rcpt in envelope.rcpt_tos)
        os.write(self.fd, lines.encode())
        return "250 2.0.0 Ok"


class _SMTP(SMTP):
    """Answers 450 at RCPT for a first offer of a ``later`` recipient."""

    def __init__(self, handler: _Handler) -> None:
        super().__init__(handler, hostname="sink.test", ident="qmgrd-test-sinkproc")
        self._sink = handler

    async def smtp_RCPT(self, arg: str) -> None:
        # The Message-ID is not known before DATA: tests make "later" addresses unique
        # per message, so the address alone says whether this is the first offer.
        address = _address(arg)
        if address.startswith("later") and address not in self._sink.deferred_once:
            self._sink.deferred_once.add(address)
            await self.push(f"450 4.2.0 <{address}>: try again later")
            return
        await super().smtp_RCPT(arg)


def _address(arg: str | None) -> str:
    if not arg:
        return ""
    text = arg[3:] if arg[:3].upper() == "TO:" else arg
    text = text.strip()
    if text.startswith("<"):
        text = text[1 : text.find(">")]
    return text.split(" ", 1)[0]


async def _main(log_path: str, count: int) -> None:
    fd = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    handler = _Handler(fd)
    loop = asyncio.get_running_loop()
    servers = [
        await loop.create_server(lambda: _SMTP(handler), "127.0.0.1", 0) for _ in range(count)
    ]
    ports = [s.sockets[0].getsockname()[1] for s in servers]
    print("READY " + " ".join(str(p) for p in ports), flush=True)
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_signal_handler(signal.SIGINT, stop.set)
    await stop.wait()
    for server in servers:
        server.close()
    os.close(fd)


if __name__ == "__main__":
    asyncio.run(_main(sys.argv[1], int(sys.argv[2])))
