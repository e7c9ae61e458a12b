"""bench/overload.py's load generator: new SMTP sessions, closed or open loop, in a process of
its own (``run_generator`` starts ``python bench/overloadgen.py --generate ...``).

Each session sends one 1 KB message with one recipient (smtp-source's shape) and ends as
``accepted`` (250), ``refused`` (421 at the greeting), ``refused late`` (421 after it),
``other``, ``timeout`` or ``error``; ``accepted_ms`` sums the accepted sessions' lengths. The
generator runs at nice ``NICE``: it stands for other machines, so it should cost this box as
little as it can. Each session is a bare ``asyncio.Protocol`` (no stream reader and writer):
a refused session costs the generator about a quarter less (150 against 205 µs of CPU, 9,000
sessions refused by a bare accept-and-refuse loop at 1,500 a second, in a network namespace of
its own, two runs each, load average 10).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import cast

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.procwatch import sample

REPO = Path(__file__).resolve().parents[1]
_BODY = b"Subject: overload\r\n\r\n" + (b"x" * 70 + b"\r\n") * 14 + b".\r\n"  # about 1 KB
_SESSION_TIMEOUT = 30.0
NICE = 10  # niceness of the generator and sink processes


class _Session(asyncio.Protocol):
    """One session, one message, as a protocol: no stream objects, one callback per reply.

    ``outcome`` resolves to accepted, refused (421 at the greeting), refused late (421
    after it: the session's work so far wasted), other, or error (the connection ended).
    """

    def __init__(self, n: int) -> None:
        self.outcome: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self.transport: asyncio.Transport | None = None
        self._buf = b""
        self._step = 0  # replies answered so far: greeting, EHLO, MAIL, RCPT, DATA, the dot
        self._lines = (
            b"EHLO gen.bench\r\n",
            f"MAIL FROM:<g{n}@gen.bench>\r\n".encode(),
            b"RCPT TO:<r@sink.bench>\r\n",
            b"DATA\r\n",
            _BODY,
            b"QUIT\r\n",
        )

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass

    def data_received(self, data: bytes) -> None:
        self._buf += data
        while not self.outcome.done() and (end := self._buf.find(b"\n")) >= 0:
            line, self._buf = self._buf[: end + 1], self._buf[end + 1 :]
            if line[3:4] != b"-":  # the last line of a reply
                self._reply(line[:3])

    def _reply(self, code: bytes) -> None:
        step, self._step = self._step, self._step + 1
        if code == b"421":
            self._end("refused" if step == 0 else "refused late")
            return
        expected = b"354" if step == 4 else b"220" if step == 0 else b"250"
        if code != expected:
            self._end("other")
            return
        assert self.transport is not None
        self.transport.write(self._lines[step])
        if step == 5:  # the message's 250: QUIT sent, done
            self._end("accepted")

    def _end(self, outcome: str) -> None:
        self.outcome.set_result(outcome)
        if self.transport is not None:
            self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.outcome.done():
            self.outcome.set_result("other" if exc is None else "error")


async def _message(port: int, n: int) -> str:
    """One session, one message (``_Session``); its transport closed however it ends."""
    session = _Session(n)
    transport, _ = await asyncio.get_running_loop().create_connection(
        lambda: session, "127.0.0.1", port
    )
    try:
        return await session.outcome
    finally:
        transport.close()


async def _guarded(port: int, n: int, counts: dict[str, int]) -> None:
    start = time.monotonic()
    try:
        outcome = await asyncio.wait_for(_message(port, n), _SESSION_TIMEOUT)
    except TimeoutError:
        outcome = "timeout"
    except OSError:
        outcome = "error"
    counts[outcome] = counts.get(outcome, 0) + 1
    if outcome == "accepted":  # a session's length: in milliseconds, summed
        counts["accepted_ms"] = counts.get("accepted_ms", 0) + int(
            (time.monotonic() - start) * 1000
        )


async def generate(port: int, mode: str, value: float, duration: float, cap: int) -> dict[str, int]:
    """closed: ``value`` sessions in parallel; open: ``value`` new sessions per second."""
    counts: dict[str, int] = {"sent": 0}
    end = time.monotonic() + duration
    if mode == "closed":

        async def worker(w: int) -> None:
            n = w
            while time.monotonic() < end:
                counts["sent"] += 1
                await _guarded(port, n, counts)
                n += int(value)

        await asyncio.gather(*(worker(w) for w in range(int(value))))
        return counts
    tasks: set[asyncio.Task[None]] = set()
    start, n = time.monotonic(), 0
    while time.monotonic() < end:
        due = start + n / value
        delay = due - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        n += 1
        if len(tasks) >= cap:
            counts["capped"] = counts.get("capped", 0) + 1
            continue
        counts["sent"] += 1
        task = asyncio.create_task(_guarded(port, n, counts))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
    if tasks:
        await asyncio.wait(tasks, timeout=_SESSION_TIMEOUT + 5)
    return counts


def nice() -> None:
    """The generator and the sink stand for other machines: they yield the CPU to the relay."""
    os.nice(NICE)


def run_generator(
    port: int, mode: str, value: float, duration: float, cap: int
) -> tuple[dict[str, int], float]:
    """Run the generator in a child process (so it does not share the bench's loop); its
    counts and the CPU seconds it used (the only child reaped meanwhile: the sink lives on)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    out = subprocess.run(
        [
            sys.executable,
            __file__,
            "--generate",
            mode,
            str(value),
            str(duration),
            str(port),
            str(cap),
        ],
        check=True,
        capture_output=True,
        cwd=str(REPO),
        preexec_fn=nice,
    )
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    counts: dict[str, int] = json.loads(out.stdout.decode().strip().splitlines()[-1])
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    return counts, cpu


def generate_into(
    counts: dict[str, int],
    cpu: list[float],
    port: int,
    mode: str,
    value: float,
    duration: float,
    args: argparse.Namespace,
) -> None:
    """``run_generator`` in a thread: its counts into ``counts``, its CPU seconds onto ``cpu``."""
    got, used = run_generator(port, mode, value, duration, args.outstanding)
    counts.update(got)
    cpu.append(used)


def mean_ms(counts: dict[str, int]) -> float:
    """The mean length of an accepted session (``accepted_ms`` taken out of ``counts``)."""
    return counts.pop("accepted_ms", 0) / max(1, counts.get("accepted", 0))


def cpu_seconds(pid: int) -> float:
    """CPU seconds so far of process ``pid`` (0 once it has gone)."""
    got = sample(pid)
    return got.cpu if got is not None else 0.0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--generate":
        mode, value, duration, port, cap = sys.argv[2:7]
        try:
            import uvloop

            result = uvloop.run(generate(int(port), mode, float(value), float(duration), int(cap)))
        except ImportError:
            result = asyncio.run(generate(int(port), mode, float(value), float(duration), int(cap)))
        print(json.dumps(result), flush=True)
        sys.exit(0)
