"""Crash safety under load: SIGKILL the daemon again and again while it accepts and delivers.

The daemon runs as a subprocess (``qmgrd -c DIR run``, with two listener worker
processes and a delivery worker: a SIGKILL of the queue manager takes them with it)
and relays to three sinks in a process of their own (``sinkproc.py``), which log every delivered
(Message-ID, recipient) and answer ``450`` once to ``later*`` recipients, so
messages also go through ``deferred/``. Eight SMTP clients inject 2,000
messages of 1-5 recipients; each attempt carries a fresh Message-ID and an
attempt counts as acknowledged only when its ``250`` arrived. Meanwhile the
daemon is killed with SIGKILL six times, each at a random moment shortly
after a trigger (during intake, during delivery, right after a move to
``deferred/``) and restarted at once. At the end:

- every recipient of every acknowledged message reached its sink (no loss);
- a recipient delivered more than once had its first delivery inside a run
  that was killed, and its message was never logged ``removed`` in that run
  (a done mark or removal the kill prevented);
- the spool is empty and nothing is in ``corrupt/``.

The figures are printed (``pytest -s``) and written to ``crash-figures.txt``
in the test's temporary directory.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import aiosmtplib
import pytest

from tests.support.config import REPO, free_port, write_config
from tests.support.process import DaemonProcess
from tests.support.waits import Changes, wait_until

SINKPROC = Path(__file__).resolve().parent / "sinkproc.py"
MESSAGES = 2000
CLIENTS = 8
DOMAINS = 3
TEST_BUDGET = 170.0  # seconds for the whole test (the task allows 3 minutes)
STEP_TIMEOUT = 60.0  # any single wait
POLL = 0.02  # seconds between looks at the sinks' delivery log and the spool (another process's)


class Tail:
    """Incremental reader of a growing text file: each poll returns only new whole lines."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self.partial = b""

    def poll(self) -> list[str]:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except FileNotFoundError:
            return []
        self.offset += len(data)
        data = self.partial + data
        *lines, self.partial = data.split(b"\n")
        return [line.decode("utf-8", "replace") for line in lines]


@dataclass(eq=False)
class Run:
    """One daemon process, from start to SIGKILL (or the final SIGTERM)."""

    index: int
    proc: DaemonProcess
    ready: float = 0.0  # when it told its supervisor READY=1
    ended: float | None = None
    kind: str = "final"  # why it ended: the kill trigger, or "final"

    @property
    def started(self) -> float:
        return self.proc.started_at

    @property
    def lines(self) -> list[str]:
        return self.proc.lines


class Harness:
    """The daemon's configuration, its runs, and the sinks' delivery log."""

    def __init__(self, root: Path, sink_ports: list[int]) -> None:
        self.root = root
        self.port = free_port()
        self.spool = root / "spool"
        routes = ", ".join(
            f"d{i}.test=smtp:[127.0.0.1]:{port}" for i, port in enumerate(sink_ports)
        )
        self.conf = write_config(
            root,
            f"transport_maps = inline:{{ {routes} }}\n"
            "minimal_backoff_time = 1s\n"
            "maximal_backoff_time = 2s\n"
            "queue_run_delay = 1s\n"
            "shutdown_timeout = 5s\n"
            "smtpd_worker_processes = 2\n"  # SIGKILL of the queue manager kills its workers
            "delivery_worker_processes = 1\n",  # and its delivery worker
            listen=f"127.0.0.1:{self.port}",
        )
        self.runs: list[Run] = []
        self.up = asyncio.Event()  # set while a started run accepts mail

    async def start(self) -> Run:
        run = Run(len(self.runs), DaemonProcess(self.conf))
        self.runs.append(run)
        run.proc.start()
        await asyncio.to_thread(run.proc.wait_ready, STEP_TIMEOUT)
        run.ready = time.time()
        self.up.set()
        return run

    def kill(self, run: Run, kind: str) -> None:
        self.up.clear()
        run.proc.kill()
        run.ended = time.time()
        run.kind = kind

    def stop(self, run: Run) -> int:
        self.up.clear()
        code = run.proc.stop(signal.SIGTERM, STEP_TIMEOUT)
        run.ended = time.time()
        return code

    def spool_contents(self) -> dict[str, list[str]]:
        out = {}
        for name in ("incoming", "active", "deferred", "hold", "corrupt", "defer", "bounce"):
            path = self.spool / name
            out[name] = sorted(os.listdir(path)) if path.is_dir() else []
        return out


@dataclass(eq=False)
class Injector:
    """Clients that submit every message until one attempt of it is acknowledged."""

    port: int
    rng: random.Random
    up: asyncio.Event  # the daemon accepts mail (cleared while it is killed and restarted)
    acked: dict[str, tuple[str, list[str]]] = field(default_factory=dict)  # msgid -> (qid, rcpts)
    changes: Changes = field(default_factory=Changes)  # notified at each acknowledgement
    attempts: int = 0
    failures: int = 0
    done: bool = False

    def plan(self) -> list[list[str]]:
        messages = []
        for i in range(MESSAGES):
            rcpts = []
            for j in range(self.rng.randint(1, 5)):
                local = "later" if self.rng.random() < 0.1 else "u"
                rcpts.append(f"{local}{i}x{j}@d{self.rng.randrange(DOMAINS)}.test")
            messages.append(rcpts)
        return messages

    async def run(self) -> None:
        messages = self.plan()
        queue: asyncio.Queue[int] = asyncio.Queue()
        for i in range(len(messages)):
            queue.put_nowait(i)
        await asyncio.gather(*(self._worker(queue, messages) for _ in range(CLIENTS)))
        self.done = True

    async def _worker(self, queue: asyncio.Queue[int], messages: list[list[str]]) -> None:
        client: aiosmtplib.SMTP | None = None
        while not queue.empty():
            i = queue.get_nowait()
            for attempt in range(500):  # bounded; a failed attempt waits for a running daemon
                msgid = f"<{i}.{attempt}@crash.test>"
                self.attempts += 1
                try:
                    if client is None:
                        client = aiosmtplib.SMTP(
                            hostname="127.0.0.1", port=self.port, timeout=20, start_tls=False
                        )
                        await client.connect()
                    content = (
                        f"Message-ID: {msgid}\r\nFrom: s@src.test\r\nSubject: m{i}\r\n\r\n"
                        f"body of {i}\r\n"
                    ).encode()
                    _errors, reply = await client.sendmail("s@src.test", messages[i], content)
                except (OSError, aiosmtplib.SMTPException, TimeoutError):
                    self.failures += 1
                    if client is not None:
                        client.close()
                        client = None
                    await asyncio.wait_for(self.up.wait(), STEP_TIMEOUT)  # the next run
                    continue
                assert "queued as " in reply, reply
                self.acked[msgid] = (reply.rsplit(" ", 1)[-1], messages[i])
                self.changes.notify()
                break
            else:
                raise AssertionError(f"message {i} was never accepted")
        if client is not None:
            client.close()


def read_deliveries(path: Path) -> list[tuple[float, str, str]]:
    """The sink's complete lines. The sink appends whole lines with one write, but a write
    that crosses a page boundary can be read half done (the file grows page by page), so a
    last line without its newline is not read yet."""
    out = []
    text = path.read_text()
    for line in text[: text.rfind("\n") + 1].splitlines():
        t, msgid, rcpt = line.split(" ")
        out.append((float(t), msgid, rcpt))
    return out


@pytest.mark.slow
async def test_sigkill_under_load_loses_nothing(tmp_path: Path) -> None:
    """Six SIGKILLs during intake, delivery and deferred moves: no acknowledged recipient is
    lost, duplicates come only from killed runs, and the spool ends empty with no corrupt file."""
    began = time.monotonic()
    rng = random.Random(20261121)
    sink_log = tmp_path / "deliveries.log"
    sinks = subprocess.Popen(
        [sys.executable, str(SINKPROC), str(sink_log), str(DOMAINS)],
        stdout=subprocess.PIPE,
        cwd=REPO,
    )
    try:
        assert sinks.stdout is not None
        ready = sinks.stdout.readline().decode().split()
        assert ready and ready[0] == "READY", ready
        h = Harness(tmp_path, [int(p) for p in ready[1:]])
        sink_tail = Tail(sink_log)
        delivered_lines = 0

        def deliveries() -> int:
            nonlocal delivered_lines
            delivered_lines += len(sink_tail.poll())
            return delivered_lines

        run = await h.start()
        injector = Injector(h.port, rng, h.up)
        inject = asyncio.create_task(injector.run())

        async def intake(count: int) -> None:
            await injector.changes.wait_for(
                lambda: len(injector.acked) >= count, f"{count} acknowledged", STEP_TIMEOUT
            )

        async def deferred_move() -> None:
            await h.runs[-1].proc.wait_line("next_attempt=", STEP_TIMEOUT)

        async def delivery() -> None:
            await h.runs[-1].proc.wait_line("status=sent", STEP_TIMEOUT)
            await wait_until(
                lambda: deliveries() >= mark + 150, "150 more deliveries", STEP_TIMEOUT, POLL
            )

        mark = 0  # deliveries seen when the current trigger was armed
        triggers: list[tuple[str, Callable[[], Awaitable[None]]]] = [
            ("intake", lambda: intake(250)),
            ("intake", lambda: intake(800)),
            ("deferred move", deferred_move),
            ("intake", lambda: intake(1400)),
            ("delivery", delivery),
            ("deferred move", deferred_move),
        ]
        for kind, trigger in triggers:
            mark = deliveries()
            await trigger()
            # A random moment after the trigger: chaos by design, not a wait for anything.
            await asyncio.sleep(rng.uniform(0.0, 0.2))
            h.kill(run, kind)
            run = await h.start()
        await asyncio.wait_for(inject, STEP_TIMEOUT)

        expected = {(m, r) for m, (_q, rcpts) in injector.acked.items() for r in rcpts}

        empty_since: list[float] = []  # when the spool was first seen empty in a row

        def finished() -> bool:
            # Queues are listed one after the other, so a message moving between them can
            # be missed once; it must look empty for a while (each poll is 20 ms apart).
            deliveries()
            got = {(m, r) for _t, m, r in read_deliveries(sink_log)}
            spool = h.spool_contents()
            if not expected <= got or any(spool[q] for q in ("incoming", "active", "deferred")):
                empty_since.clear()
                return False
            if not empty_since:
                empty_since.append(time.monotonic())
            return time.monotonic() - empty_since[0] >= 0.5

        remaining = TEST_BUDGET - (time.monotonic() - began)
        await wait_until(
            finished, "every acknowledged recipient and an empty spool", remaining, POLL
        )
        assert h.stop(run) == 0
    finally:
        for r in getattr(locals().get("h"), "runs", []):
            r.proc.close()
        sinks.terminate()
        sinks.wait(STEP_TIMEOUT)
        if sinks.stdout is not None:
            sinks.stdout.close()

    records = read_deliveries(sink_log)
    got = Counter((m, r) for _t, m, r in records)
    first: dict[tuple[str, str], float] = {}
    for t, m, r in records:
        first.setdefault((m, r), t)
    lost = sorted(expected - set(got))
    duplicates = sorted(k for k, n in got.items() if n > 1)
    qid_of = {m: q for m, (q, _r) in injector.acked.items()}
    unexplained = []
    for key in duplicates:
        # The sinks finish a transaction from their socket buffers after the daemon died,
        # so a delivery made by run k can be stamped after the kill: a first delivery
        # belongs to the last run started before it, up to the next run's start-up line.
        t = first[key]
        owner = next(
            (
                r
                for r, after in zip(h.runs, [*h.runs[1:], None], strict=True)
                if r.started <= t and (after is None or t < after.ready)
            ),
            None,
        )
        removed = (
            owner is not None
            and key[0] in qid_of
            and any(line.startswith(f"{qid_of[key[0]]}: removed") for line in owner.lines)
        )
        if owner is None or owner.kind == "final" or removed:
            unexplained.append((key, owner.kind if owner else None, removed))
    figures = (
        f"messages acknowledged={len(injector.acked)} attempts={injector.attempts} "
        f"failed attempts={injector.failures} recipients={len(expected)} "
        f"deliveries={len(records)} kills={len(h.runs) - 1} "
        f"({', '.join(r.kind for r in h.runs[:-1])}) duplicates={len(duplicates)} "
        f"losses={len(lost)} elapsed={time.monotonic() - began:.1f}s"
    )
    print(figures)
    (tmp_path / "crash-figures.txt").write_text(figures + "\n")
    spool = h.spool_contents()
    assert len(injector.acked) == MESSAGES
    assert lost == [], lost[:10]
    assert unexplained == [], unexplained[:10]
    assert spool == {name: [] for name in spool}, spool
    assert len(h.runs) - 1 >= 5
