"""One message in a session of its own, as smtp-source sends it, telling queued from 421."""

from __future__ import annotations

import asyncio
import re

from tests.support.waits import TIMEOUT

__all__ = ["one_message", "read_reply"]

_QUEUED = re.compile(r"^250 2\.0\.0 Ok: queued as (\S+)")


async def read_reply(reader: asyncio.StreamReader) -> str:
    """One SMTP reply (its last line), bounded."""
    while True:
        line = (await asyncio.wait_for(reader.readline(), TIMEOUT)).decode().rstrip("\r\n")
        if not line or line[3:4] != "-":
            return line


async def one_message(port: int, n: int) -> tuple[str, str]:
    """Send one message in its own session: ("accepted", id) or ("refused", the 421 line)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        greeting = await read_reply(reader)
        if greeting.startswith("421"):
            return "refused", greeting
        for line in ("EHLO client.test", f"MAIL FROM:<s{n}@src.test>"):
            writer.write(line.encode() + b"\r\n")
            reply = await read_reply(reader)
            if reply.startswith("421"):
                return "refused", reply
        for line in (f"RCPT TO:<r{n}@dst.test>", "DATA"):
            writer.write(line.encode() + b"\r\n")
            await read_reply(reader)
        writer.write(f"Subject: m{n}\r\nX-N: {n}\r\n\r\nbody {n}\r\n.\r\n".encode())
        end = await read_reply(reader)
        match = _QUEUED.match(end)
        assert match, f"message {n}: unexpected reply {end!r}"
        writer.write(b"QUIT\r\n")
        return "accepted", match.group(1)
    finally:
        writer.close()
