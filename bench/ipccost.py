"""What one commit notice costs on the worker -> queue manager channel, on both sides.

    .venv/bin/python bench/ipccost.py [-n 20000] [--gap-ms 2] [--batches 1,4,16]

Two parts, CPU time only (``time.process_time`` and the child's ``os.times``):

1. the Python steps, in a loop in this process: ``encode_commit`` (the
   worker), ``parse`` + ``commit_from`` (the queue manager), and the queue
   manager's whole dispatch of a line (``Supervisor._dispatch`` ->
   ``WorkerPool.handle`` -> ``on_commit``, with an ``on_commit`` that does nothing);
2. the channel: a forked child (the worker) sends ``-n`` commit notices over a
   ``socketpair`` in batches of B lines per write, one batch every ``B *
   gap-ms`` milliseconds (``--gap-ms`` 2: about 500 messages a second, one
   worker's share of the standard benchmark), while this process (the queue
   manager) reads them with the supervisor's own reader (``Supervisor._read``:
   ``StreamReader.readline`` and ``_dispatch``) on uvloop. Both processes' CPU
   per message is printed, minus each one's idle cost over the same time (a
   run that sends nothing), so what is left is what the notices cost: the
   send, the wake-up, the read, the decode and the dispatch.

A benchmark prints; nothing is asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from qmgrd.daemon.ipc import commit_from, encode_commit, parse
from qmgrd.daemon.process import loop_factory
from qmgrd.daemon.supervise import Child, Supervisor
from qmgrd.listener.observer import Committed

COMMIT = Committed("4XyZ1B2C3D4E5F", "sender@src.bench", "127.0.0.1", None, 1)


class _Pool(Supervisor):
    """The queue manager's side: commits counted, nothing else."""

    def __init__(self) -> None:
        super().__init__(1, what="bench", program="bench")
        self.commits = 0

    def handle(self, child: Child, fields: list[Any]) -> None:
        if fields[0] == "c":
            commit_from(fields)
            self.commits += 1


def _per_call(fn: Any, n: int) -> float:
    t0 = time.process_time()
    for _ in range(n):
        fn()
    return (time.process_time() - t0) / n * 1e6


def steps(n: int) -> None:
    """Part 1: microseconds per call of each step."""
    line = encode_commit(COMMIT)
    fields = parse(line)
    pool = _Pool()
    child: Any = object()
    print(f"notice: {len(line)} bytes")
    print(f"  encode_commit        {_per_call(lambda: encode_commit(COMMIT), n):6.2f} us")
    print(f"  parse                {_per_call(lambda: parse(line), n):6.2f} us")
    print(f"  commit_from          {_per_call(lambda: commit_from(fields), n):6.2f} us")
    print(f"  Supervisor._dispatch {_per_call(lambda: pool._dispatch(child, line), n):6.2f} us")


def _child(sock: socket.socket, n: int, batch: int, gap: float, report: int) -> None:
    """The worker: send ``n`` notices, ``batch`` per write, then report its CPU."""
    line = encode_commit(COMMIT)
    t_cpu = os.times()
    start = time.monotonic()
    sent = 0
    while sent < n:
        data = b"".join(encode_commit(COMMIT) for _ in range(min(batch, n - sent))) if n else b""
        if data:
            sock.sendall(data)
            sent += data.count(b"\n")
        start += gap * batch
        delay = start - time.monotonic()
        if delay > 0:
            time.sleep(delay)
    if n == 0:
        time.sleep(gap * batch * report)  # idle for as long as a real run
    end = os.times()
    cpu = end.user + end.system - t_cpu.user - t_cpu.system
    sock.sendall(f"done {cpu:.6f}\n".encode())
    del line
    sock.close()


async def _read(sock: socket.socket, pool: _Pool) -> float:
    reader, writer = await asyncio.open_unix_connection(sock=sock, limit=1 << 20)
    child_cpu = 0.0
    while line := await reader.readline():
        if line.startswith(b"done "):
            child_cpu = float(line.split()[1])
            break
        pool._dispatch(child_any, line)
    writer.close()
    return child_cpu


child_any: Any = None


def channel(n: int, batch: int, gap: float, idle_for: int = 0) -> tuple[float, float, int]:
    """One channel run: the parent's and the child's CPU seconds, commits seen."""
    ours, theirs = socket.socketpair()
    pid = os.fork()
    if pid == 0:  # the worker
        ours.close()
        try:
            _child(theirs, n, batch, gap, idle_for)
        finally:
            os._exit(0)
    theirs.close()
    pool = _Pool()
    factory = loop_factory()
    t0 = time.process_time()
    with asyncio.Runner(loop_factory=factory) as runner:
        child_cpu = runner.run(_read(ours, pool))
    parent_cpu = time.process_time() - t0
    os.waitpid(pid, 0)
    return parent_cpu, child_cpu, pool.commits


def main() -> int:
    """Print both parts."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("-n", type=int, default=20000, help="notices per channel run")
    parser.add_argument("--gap-ms", type=float, default=2.0, help="milliseconds between notices")
    parser.add_argument("--batches", default="1,4,16", help="notices per write, comma list")
    args = parser.parse_args()
    print(f"loadavg={os.getloadavg()[0]:.1f} n={args.n} gap={args.gap_ms} ms")
    steps(args.n)
    gap = args.gap_ms / 1000
    for batch in (int(word) for word in args.batches.split(",")):
        writes = (args.n + batch - 1) // batch
        idle_parent, idle_child, _ = channel(0, batch, gap, idle_for=writes)
        parent, child, seen = channel(args.n, batch, gap)
        per = 1e6 / args.n
        print(
            f"batch {batch:3d}: queue manager {(parent - idle_parent) * per:6.2f} us/notice "
            f"(raw {parent * per:.2f}), worker {(child - idle_child) * per:6.2f} us/notice "
            f"(raw {child * per:.2f}), {seen} seen"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
