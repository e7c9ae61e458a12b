"""The floor: the least a single-process Python relay can spend per message on the standard load.

    .venv/bin/python bench/floorrelay.py --port P --sinks P1[,P2...] --log FILE [--spool DIR]
    .venv/bin/python bench/postfix_bench.py --relays qmgrd,floor,postfix   # how it is used

Not a mail server: a measuring stick for ``bench/postfix_bench.py``. It does
only what any relay must do on ``smtp-source -> relay -> smtp-sink`` and
nothing a real one also does (no queue file records, no scheduler, no
policy, no DSN, no per-message log wording, no limits, no error handling
beyond dropping a broken session): a uvloop ``asyncio.Protocol`` SMTP server
that answers each buffer with one write and finds the end of DATA with one
``bytes.find`` per chunk, and an SMTP client that keeps up to 20 cached
connections per destination and sends MAIL, RCPT and DATA pipelined, then
the content in one write. With ``--spool DIR`` each message is written to a
file there and made durable (fsync, one directory fsync per batch, one
thread hop per batch: group commit; ``--fsync-threads N`` spreads a batch's
file fsyncs over N threads) before its 250 reply; without it
nothing touches the disk. One ``status=sent`` line per recipient goes to
``--log`` (buffered, flushed once per loop pass) so the bench times it as it
times qmgrd and Postfix. Recipients ``Nto@...`` go to the Nth sink (the
10-destination shape), others to the first.

Every session and delivery is bounded by the load itself: the process runs
until SIGTERM or SIGINT (the bench stops it), and prints its CPU seconds on
exit.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import os
import resource
import signal
import sys
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

_EHLO = b"250-floor.bench\r\n250-PIPELINING\r\n250-8BITMIME\r\n250 SIZE 104857600\r\n"
_END = b"\r\n.\r\n"
_CACHE = 20


@dataclass(slots=True)
class Message:
    """One accepted message."""

    sender: bytes
    rcpts: list[bytes]
    body: bytes


@dataclass(slots=True)
class Relay:
    """Shared state: sinks, destination queues, log buffer, spool."""

    sinks: list[int]
    log: BinaryIO
    spool: Path | None
    fsync_pool: ThreadPoolExecutor | None = None
    queues: dict[int, deque[tuple[Message, list[bytes]]]] = field(default_factory=dict)
    idle: dict[int, list[ClientProtocol]] = field(default_factory=dict)
    busy: dict[int, int] = field(default_factory=dict)
    pending_log: list[bytes] = field(default_factory=list)
    commits: list[tuple[Message, asyncio.Future[None]]] = field(default_factory=list)
    committing: bool = False
    names: itertools.count[int] = field(default_factory=itertools.count)

    def route(self, rcpt: bytes) -> int:
        """The sink port for one recipient."""
        head = rcpt.lstrip(b"<").split(b"to@", 1)[0]
        if len(self.sinks) > 1 and head.isdigit() and 1 <= int(head) <= len(self.sinks):
            return self.sinks[int(head) - 1]
        return self.sinks[0]

    def deliver(self, msg: Message) -> None:
        """Queue a message per destination and start what can start."""
        by_port: dict[int, list[bytes]] = {}
        for rcpt in msg.rcpts:
            by_port.setdefault(self.route(rcpt), []).append(rcpt)
        for port, rcpts in by_port.items():
            self.queues.setdefault(port, deque()).append((msg, rcpts))
            self.kick(port)

    def kick(self, port: int) -> None:
        """Hand queued work to an idle cached connection or open a new one."""
        queue = self.queues.get(port)
        while queue:
            idle = self.idle.setdefault(port, [])
            if idle:
                idle.pop().send(*queue.popleft())
            elif self.busy.get(port, 0) < _CACHE:
                self.busy[port] = self.busy.get(port, 0) + 1
                asyncio.get_running_loop().create_task(self.connect(port))
                return
            else:
                return

    async def connect(self, port: int) -> None:
        """A new client connection; it takes work once it has read the EHLO reply."""
        loop = asyncio.get_running_loop()
        try:
            await loop.create_connection(lambda: ClientProtocol(self, port), "127.0.0.1", port)
        except OSError:
            self.busy[port] -= 1

    def sent(self, rcpts: list[bytes]) -> None:
        """Log one status=sent line per recipient (written at the end of this loop pass)."""
        if not self.pending_log:
            asyncio.get_running_loop().call_soon(self.flush_log)
        self.pending_log.extend(b"floor: to=%s, status=sent\n" % r for r in rcpts)

    def flush_log(self) -> None:
        """One write for every line of the pass."""
        self.log.write(b"".join(self.pending_log))
        self.log.flush()
        self.pending_log.clear()

    def commit(self, msg: Message) -> asyncio.Future[None]:
        """Durable before the reply: queued for the next group commit."""
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.commits.append((msg, fut))
        if not self.committing:
            self.committing = True
            asyncio.get_running_loop().create_task(self.group_commit())
        return fut

    async def group_commit(self) -> None:
        """One thread hop per batch: write + fsync each file, one directory fsync."""
        assert self.spool is not None
        while self.commits:
            batch, self.commits = self.commits, []
            names = [str(next(self.names)) for _ in batch]
            msgs = [m for m, _ in batch]
            await asyncio.to_thread(_write_all, self.spool, names, msgs, self.fsync_pool)
            for msg, fut in batch:
                fut.set_result(None)
                self.deliver(msg)
        self.committing = False


def _write_one(path: Path, msg: Message) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, msg.sender + b"\n" + b"\n".join(msg.rcpts) + b"\n\n" + msg.body)
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_all(
    spool: Path, names: list[str], msgs: list[Message], pool: ThreadPoolExecutor | None
) -> None:
    if pool is not None and len(msgs) > 1:
        list(pool.map(_write_one, [spool / n for n in names], msgs))
    else:
        for name, msg in zip(names, msgs, strict=True):
            _write_one(spool / name, msg)
    dfd = os.open(spool, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


class ServerProtocol(asyncio.Protocol):
    """One inbound session."""

    def __init__(self, relay: Relay) -> None:
        """Nothing received yet."""
        self.relay = relay
        self.transport: asyncio.Transport | None = None
        self.buf = b""
        self.in_data = False
        self.sender = b""
        self.rcpts: list[bytes] = []
        self.ids = itertools.count()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        """Greet."""
        self.transport = transport  # type: ignore[assignment]  # uvloop's is not a subclass
        transport.write(b"220 floor.bench ESMTP\r\n")  # type: ignore[attr-defined]

    def data_received(self, data: bytes) -> None:
        """Parse everything buffered; answer with one write."""
        buf = self.buf + data if self.buf else data
        out: list[bytes] = []
        pos = 0
        while pos < len(buf):
            if self.in_data:
                if buf.startswith(b".\r\n", pos):
                    end, stop = pos, pos + 3
                else:
                    end = buf.find(_END, pos)
                    if end < 0:
                        break
                    end, stop = end + 2, end + len(_END)
                body = buf[pos:end].replace(b"\r\n..", b"\r\n.")
                self.accept(Message(self.sender, self.rcpts, body))
                self.in_data, self.rcpts = False, []
                pos = stop
                continue
            eol = buf.find(b"\r\n", pos)
            if eol < 0:
                break
            line = buf[pos:eol]
            pos = eol + 2
            verb = line[:4].upper()
            if verb == b"RCPT":
                self.rcpts.append(line[8:].strip())
                out.append(b"250 2.1.5 Ok\r\n")
            elif verb == b"MAIL":
                self.sender, self.rcpts = line[10:].strip(), []
                out.append(b"250 2.1.0 Ok\r\n")
            elif verb == b"DATA" and self.rcpts:
                self.in_data = True
                out.append(b"354 End data with <CR><LF>.<CR><LF>\r\n")
            elif verb == b"EHLO":
                out.append(_EHLO)
            elif verb in (b"RSET", b"NOOP", b"HELO"):
                out.append(b"250 2.0.0 Ok\r\n")
            elif verb == b"QUIT":
                out.append(b"221 2.0.0 Bye\r\n")
                self.write(out)
                assert self.transport is not None
                self.transport.close()
                return
            else:
                out.append(b"502 5.5.2 Error: command not recognized\r\n")
        self.buf = buf[pos:]
        self.write(out)

    def write(self, out: list[bytes]) -> None:
        """One write for the buffer's replies."""
        if out and self.transport is not None and not self.transport.is_closing():
            self.transport.write(b"".join(out))

    def accept(self, msg: Message) -> None:
        """Reply 250 now (no spool) or once the group commit has it on disk."""
        if self.relay.spool is None:
            self.relay.deliver(msg)
            self.write([b"250 2.0.0 Ok: queued\r\n"])
            return
        self.relay.commit(msg).add_done_callback(
            lambda _f: self.write([b"250 2.0.0 Ok: queued\r\n"])
        )


class ClientProtocol(asyncio.Protocol):
    """One cached outbound connection: EHLO once, then pipelined transactions."""

    def __init__(self, relay: Relay, port: int) -> None:
        """Connecting."""
        self.relay = relay
        self.port = port
        self.transport: asyncio.Transport | None = None
        self.buf = b""
        self.want = 0  # final replies still expected (a multi-line reply counts once)
        self.stage = "banner"
        self.job: tuple[Message, list[bytes]] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        """Wait for the banner."""
        self.transport = transport  # type: ignore[assignment]
        self.want = 1

    def connection_lost(self, exc: Exception | None) -> None:
        """Forget the connection; requeue what it held."""
        idle = self.relay.idle.get(self.port, [])
        if self in idle:
            idle.remove(self)
        self.relay.busy[self.port] -= 1
        if self.job is not None:
            self.relay.queues[self.port].appendleft(self.job)
            self.job = None
        self.relay.kick(self.port)

    def send(self, msg: Message, rcpts: list[bytes]) -> None:
        """MAIL, every RCPT and DATA in one write."""
        assert self.transport is not None
        self.job = (msg, rcpts)
        cmds = [b"MAIL FROM:%s\r\n" % msg.sender]
        cmds += [b"RCPT TO:%s\r\n" % r for r in rcpts]
        cmds.append(b"DATA\r\n")
        self.stage, self.want = "envelope", len(cmds)
        self.transport.write(b"".join(cmds))

    def data_received(self, data: bytes) -> None:
        """Count final reply lines; move to the next stage when all came."""
        buf = self.buf + data if self.buf else data
        pos = 0
        while True:
            eol = buf.find(b"\r\n", pos)
            if eol < 0:
                break
            if buf[pos + 3 : pos + 4] != b"-":
                self.want -= 1
            pos = eol + 2
        self.buf = buf[pos:]
        if self.want == 0:
            self.advance()

    def advance(self) -> None:
        """The next step of the session."""
        assert self.transport is not None
        if self.stage == "banner":
            self.stage, self.want = "ehlo", 1
            self.transport.write(b"EHLO relay.floor\r\n")
        elif self.stage == "envelope":
            assert self.job is not None
            body = self.job[0].body.replace(b"\r\n.", b"\r\n..")
            if body.startswith(b"."):
                body = b"." + body
            self.stage, self.want = "data", 1
            self.transport.write(body + b".\r\n")
        else:
            if self.stage == "data":
                assert self.job is not None
                self.relay.sent(self.job[1])
                self.job = None
            self.stage = "idle"
            queue = self.relay.queues.get(self.port)
            if queue:
                self.send(*queue.popleft())
            else:
                self.relay.idle.setdefault(self.port, []).append(self)


async def serve(args: argparse.Namespace) -> None:
    """Listen until SIGTERM/SIGINT."""
    loop = asyncio.get_running_loop()
    with open(args.log, "ab") as log:
        spool = Path(args.spool) if args.spool else None
        pool = ThreadPoolExecutor(args.fsync_threads) if args.fsync_threads > 1 else None
        relay = Relay([int(p) for p in args.sinks.split(",")], log, spool, pool)
        server = await loop.create_server(
            lambda: ServerProtocol(relay), "127.0.0.1", args.port, backlog=1024
        )
        stop = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
        server.close()


def main() -> None:
    """Parse arguments, run on uvloop, print CPU seconds."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--sinks", required=True, help="comma list of sink ports on 127.0.0.1")
    parser.add_argument("--log", required=True)
    parser.add_argument("--spool", default=None, help="make each message durable here first")
    parser.add_argument(
        "--fsync-threads", type=int, default=0, help="fsync a batch's files in N threads at once"
    )
    args = parser.parse_args()
    try:
        import uvloop
    except ImportError:
        asyncio.run(serve(args))
    else:
        with contextlib.suppress(KeyboardInterrupt):
            uvloop.run(serve(args))
    usage = resource.getrusage(resource.RUSAGE_SELF)
    print(f"cpu_s={usage.ru_utime + usage.ru_stime:.3f}", file=sys.stderr)


if __name__ == "__main__":
    main()
