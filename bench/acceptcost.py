"""What one connection costs the server's process, by how it is accepted: the listener's way
against the loop's own server.

    .venv/bin/python bench/acceptcost.py [-n 5000] [--rounds 3] [--ways acceptor,server]
    for n in 1000 3000; do valgrind --tool=callgrind --callgrind-out-file=/tmp/ac_$n.out \
        .venv/bin/python bench/acceptcost.py -n $n --rounds 1 --ways acceptor 2>&1 \
        | grep "I   refs"; done    # instructions per connection: (I(3000) - I(1000)) / 2000

A client process opens ``-n`` connections one after another on loopback; each
reads a 220 line, sends QUIT, reads 221 and the end of the stream (the shape
of a session, without its commands). The server, on uvloop, answers with a
bare ``asyncio.Protocol`` (no SMTP, no session), accepted either

- ``acceptor``: as the listener accepts (``qmgrd.listener.accepting.Acceptor``:
  a non-blocking ``accept`` in a reader callback, then a task that wraps the
  socket with ``loop.connect_accepted_socket``, as ``ListenerHandle._session``
  does), or
- ``server``: by the loop itself (``loop.create_server``: libuv accepts in C
  and calls the protocol factory).

Printed per round and way: the server process's CPU (``time.process_time``)
per connection. The difference is what the listener's accepting costs beyond
the loop's own (its admission decisions, holds and refusals need it: see
``qmgrd.listener.accepting``). ``--ways`` runs only the ways named (one at a
time under callgrind; the client is this script started anew, ``--client``, so
valgrind, which follows no ``exec`` unless told to, counts the server only).
A benchmark prints; nothing is asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from qmgrd.daemon.process import loop_factory
from qmgrd.listener.accepting import Acceptor


class _Bye(asyncio.Protocol):
    """220 at once, 221 and close on the first bytes."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        transport.write(b"220 bench\r\n")  # type: ignore[attr-defined]

    def data_received(self, data: bytes) -> None:
        self.transport.write(b"221 2.0.0 Bye\r\n")  # type: ignore[attr-defined]
        self.transport.close()


def _client(port: int, n: int) -> None:
    for _ in range(n):
        with socket.create_connection(("127.0.0.1", port)) as conn:
            conn.recv(100)
            conn.sendall(b"QUIT\r\n")
            while conn.recv(100):
                pass


async def _round(way: str, n: int) -> float:
    loop = asyncio.get_running_loop()
    lsock = socket.socket()
    lsock.bind(("127.0.0.1", 0))
    lsock.listen(128)
    lsock.setblocking(False)
    port = lsock.getsockname()[1]
    tasks: set[asyncio.Task[None]] = set()
    server: asyncio.AbstractServer | None = None
    acceptor: Acceptor | None = None
    if way == "server":
        server = await loop.create_server(_Bye, sock=lsock)
    else:

        async def serve(conn: socket.socket) -> None:
            try:
                await loop.connect_accepted_socket(_Bye, sock=conn)
            finally:  # the task leaves the set itself, as the listener's do
                if (task := asyncio.current_task(loop)) is not None:
                    tasks.discard(task)

        def admit(conn: socket.socket, addr: str) -> bool:
            tasks.add(loop.create_task(serve(conn)))
            return True

        acceptor = Acceptor(loop, admit, batch=4)  # a listener worker's batch
        acceptor.listen(lsock)
    t0 = time.process_time()
    client = subprocess.Popen([sys.executable, __file__, "--client", str(port), str(n)])
    await loop.run_in_executor(None, client.wait)
    used = time.process_time() - t0
    if server is not None:
        server.close()
    if acceptor is not None:
        acceptor.close()
    return used / n * 1e6


async def _main(n: int, rounds: int, ways: list[str]) -> None:
    for r in range(1, rounds + 1):
        for way in ways:
            print(f"round={r} {way:8} {await _round(way, n):6.1f} us CPU per connection")


def main() -> int:
    """Run the rounds and print."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("-n", type=int, default=5000, help="connections per round and way")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--ways", default="acceptor,server", help="comma list of the ways")
    parser.add_argument("--client", nargs=2, type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.client:
        _client(*args.client)
        return 0
    print(f"loadavg={os.getloadavg()[0]:.1f} n={args.n}")
    with asyncio.Runner(loop_factory=loop_factory()) as runner:
        runner.run(_main(args.n, args.rounds, args.ways.split(",")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
