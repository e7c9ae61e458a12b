"""bench/overload.py's load generator: new SMTP sessions, closed or open loop, in a process of
its own (``run_generator`` starts ``python bench/overloadgen.py --generate ...``).

Each session sends one 1 KB message with one recipient (smtp-source's shape) and ends as
``accepted`` (250), ``refused`` (421 at the greeting), ``refused late`` (421 after it),
``other``, ``timeout`` or ``error``; ``accepted_ms`` sums the accepted sessions' lengths. The
generator runs at nice ``NICE``: it stands for other machines.
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

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.procwatch import sample

REPO = Path(__file__).resolve().parents[1]
_BODY = b"Subject: overload\r\n\r\n" + (b"x" * 70 + b"\r\n") * 14 + b".\r\n"  # about 1 KB
_SESSION_TIMEOUT = 30.0
NICE = 10  # niceness of the generator and sink processes


async def _reply(reader: asyncio.StreamReader) -> bytes:
    while True:
        line = await reader.readline()
        if not line or line[3:4] != b"-":
            return line


async def _message(port: int, n: int) -> str:
    """One session, one message: accepted, refused (421), other, or error."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        if (await _reply(reader)).startswith(b"421"):
            return "refused"
        steps = (
            b"EHLO gen.bench",
            f"MAIL FROM:<g{n}@gen.bench>".encode(),
            b"RCPT TO:<r@sink.bench>",
        )
        for line in steps:
            writer.write(line + b"\r\n")
            reply = await _reply(reader)
            if reply.startswith(b"421"):
                return "refused late"  # after the session's start: its work so far wasted
            if not reply.startswith(b"250"):
                return "other"
        writer.write(b"DATA\r\n")
        if not (await _reply(reader)).startswith(b"354"):
            return "other"
        writer.write(_BODY)
        reply = await _reply(reader)
        writer.write(b"QUIT\r\n")
        return "accepted" if reply.startswith(b"250") else "other"
    finally:
        writer.close()


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
