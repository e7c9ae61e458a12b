"""A lean SMTP sink for benchmarks, meant to run in its own process.

    .venv/bin/python bench/sinkproc.py [--host 127.0.0.1] [--port 0]

Prints the bound port on the first line of stdout, accepts every message,
and when stdin reaches end of file prints one JSON line of counters
(``connections``, ``messages``, ``recipients``, ``bytes``, ``cpu_s``) and exits.

It is a plain ``asyncio.Protocol`` on uvloop rather than aiosmtpd so that the
sink costs little CPU next to the daemon being measured on a small machine:
it parses whole buffers, answers pipelined commands with one write, and finds
the end of DATA with one ``bytes.find`` per chunk. It speaks just enough ESMTP
for the qmgrd SMTP agent: EHLO (PIPELINING, 8BITMIME, SIZE, SMTPUTF8), HELO,
MAIL, RCPT, DATA, RSET, NOOP, QUIT. Never use it as a real server.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from dataclasses import dataclass

_EHLO = (
    b"250-sink.bench\r\n250-PIPELINING\r\n250-8BITMIME\r\n"
    b"250-SIZE 104857600\r\n250-SMTPUTF8\r\n250 ENHANCEDSTATUSCODES\r\n"
)
_END = b"\r\n.\r\n"


@dataclass(slots=True)
class Counters:
    """What the sink saw, printed at exit."""

    connections: int = 0
    messages: int = 0
    recipients: int = 0
    bytes: int = 0


class SinkProtocol(asyncio.Protocol):
    """One SMTP session: command mode until DATA, then data mode until <CRLF>.<CRLF>."""

    def __init__(self, counters: Counters) -> None:
        """Count into the process-wide ``counters``."""
        self.counters = counters
        self.transport: asyncio.Transport | None = None
        self.buf = b""
        self.in_data = False
        self.data_len = 0
        self.rcpts = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        """Greet."""
        self.transport = transport  # type: ignore[assignment]  # uvloop's is not a subclass
        self.counters.connections += 1
        transport.write(b"220 sink.bench ESMTP\r\n")  # type: ignore[attr-defined]

    def data_received(self, data: bytes) -> None:
        """Parse everything buffered; answer with one write."""
        buf = self.buf + data if self.buf else data
        out: list[bytes] = []
        pos = 0
        while pos < len(buf):
            if self.in_data:
                # The end marker may be the very first line of the content (empty body).
                if self.data_len == 0 and buf.startswith(b".\r\n", pos):
                    end, stop = pos, pos + 3
                else:
                    end = buf.find(_END, pos)
                    if end < 0:
                        keep = max(pos, len(buf) - 4)
                        self.data_len += keep - pos
                        pos = keep
                        break
                    stop = end + len(_END)
                self.data_len += end - pos
                self.counters.messages += 1
                self.counters.recipients += self.rcpts
                self.counters.bytes += self.data_len
                self.in_data = False
                self.rcpts = 0
                out.append(b"250 2.0.0 Ok: queued\r\n")
                pos = stop
                continue
            eol = buf.find(b"\r\n", pos)
            if eol < 0:
                break
            line = buf[pos:eol]
            pos = eol + 2
            verb = line[:4].upper()
            if verb == b"RCPT":
                self.rcpts += 1
                out.append(b"250 2.1.5 Ok\r\n")
            elif verb == b"MAIL":
                self.rcpts = 0
                out.append(b"250 2.1.0 Ok\r\n")
            elif verb == b"DATA":
                if self.rcpts:
                    self.in_data = True
                    self.data_len = 0
                    out.append(b"354 End data with <CR><LF>.<CR><LF>\r\n")
                else:
                    out.append(b"503 5.5.1 Error: need RCPT command\r\n")
            elif verb == b"EHLO":
                out.append(_EHLO)
            elif verb in (b"RSET", b"NOOP", b"HELO"):
                self.rcpts = 0 if verb == b"RSET" else self.rcpts
                out.append(b"250 2.0.0 Ok\r\n")
            elif verb == b"QUIT":
                out.append(b"221 2.0.0 Bye\r\n")
                assert self.transport is not None
                self.transport.write(b"".join(out))
                self.transport.close()
                self.buf = b""
                return
            else:
                out.append(b"502 5.5.2 Error: command not recognized\r\n")
        self.buf = buf[pos:]
        if out and self.transport is not None:
            self.transport.write(b"".join(out))


async def serve(host: str, port: int) -> Counters:
    """Listen until stdin closes; return the counters."""
    loop = asyncio.get_running_loop()
    counters = Counters()
    server = await loop.create_server(lambda: SinkProtocol(counters), host, port, backlog=1024)
    print(server.sockets[0].getsockname()[1], flush=True)
    await loop.run_in_executor(None, sys.stdin.read)
    server.close()
    return counters


def main() -> None:
    """Parse arguments, serve, print counters as JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args()
    try:
        import uvloop

        counters = uvloop.run(serve(args.host, args.port))
    except ImportError:
        counters = asyncio.run(serve(args.host, args.port))
    report = {
        "connections": counters.connections,
        "messages": counters.messages,
        "recipients": counters.recipients,
        "bytes": counters.bytes,
        "cpu_s": time.process_time(),
    }
    print(json.dumps(report), flush=True)


if __name__ == "__main__":
    main()
