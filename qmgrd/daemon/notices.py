"""Notices: build bounce and delay notices without letting one message wedge the daemon.

Contract
--------
``NoticeComposer.compose(msg, records, kind, now) -> bytes`` returns the
bytes of a notice (``kind`` ``failure`` or ``delay``) for ``records`` of the
loaded message ``msg``, and never raises for anything the message contains:

1. the full notice (``qmgrd.delivery.dsn.compose_dsn``, with the original
   attached, or its headers only for RET=HDRS, delay notices and originals
   larger than ``bounce_size_limit``; only the first ``bounce_size_limit + 2``
   bytes of the original are read) is built on
   the composer's **own** small pool of daemon threads, never on the spool's
   ``IoBatcher`` workers, and waited for at most ``timeout`` seconds from the
   moment a thread starts it (``asyncio.wait_for``; a burst of bounces queues
   without timing out, and waiting for a thread is bounded by
   ``queue_timeout``);
2. a failure or a timeout is logged with the queue id and tried again, up to
   ``attempts`` times;
3. then :func:`minimal_dsn` is returned: a plain RFC 3464 report built here,
   from the envelope and the reason records only, that never reads the
   original's content (nothing in it can fail on hostile bytes).

A composition that hangs (a parser loop on a crafted header) keeps its
thread busy. The pool (:class:`ThreadPool`) writes such a thread off when its
job overruns ``timeout`` and starts a replacement, up to
``COMPOSE_MAX_THREADS`` threads in all; once every thread is written off it is
jammed and every notice is minimal at once, until the daemon restarts. So the
damage of hostile content is bounded: a few threads, never the spool's
workers, never another message's delivery. The threads are daemon threads,
so a stuck one never keeps the process from exiting (SIGTERM still stops the
daemon in time).
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from email.utils import format_datetime
from typing import Any, Literal

from qmgrd.daemon.context import EngineContext
from qmgrd.daemon.table import ActiveMessage
from qmgrd.delivery.dsn import DsnRecipient, compose_dsn
from qmgrd.spool import QueueFileContent, ReasonRecord

__all__ = ["Job", "NoticeComposer", "NoticeKind", "PoolBusy", "ThreadPool", "minimal_dsn"]

NoticeKind = Literal["failure", "delay"]

COMPOSE_TIMEOUT = 30.0  # seconds one notice composition may take once a thread runs it
COMPOSE_ATTEMPTS = 2  # full compositions tried before the minimal notice
COMPOSE_WORKERS = 2  # threads composing at once
COMPOSE_MAX_THREADS = 4  # workers plus threads written off as stuck; then every notice is minimal
COMPOSE_BACKLOG = 4096  # notices waiting for a thread; more get the minimal notice at once
QUEUE_TIMEOUT = 120.0  # seconds a notice may wait for a thread
_REASON_MAX = 900  # characters of a diagnostic kept in the minimal notice


class PoolBusy(Exception):
    """No composer thread can take the job (backlog full, or every thread stuck)."""


class Job:
    """One queued call: ``started`` resolves when a thread takes it, ``result`` with its value."""

    __slots__ = ("abandoned", "fn", "result", "started")

    def __init__(self, fn: Callable[[], Any], loop: asyncio.AbstractEventLoop) -> None:
        """A job for ``fn`` whose futures belong to ``loop``."""
        self.fn = fn
        self.started: asyncio.Future[None] = loop.create_future()
        self.result: asyncio.Future[Any] = loop.create_future()
        self.abandoned = False  # its waiter gave up while it ran: the thread may be stuck


class ThreadPool:
    """A few daemon threads running blocking callables (see the module doc).

    ``workers`` threads take jobs; a thread whose job overran is written off
    (``abandon``) and replaced, up to ``max_threads`` threads in all, stuck
    ones included. When every thread is written off the pool is ``jammed``:
    ``submit`` fails at once, so callers fall back without waiting.
    """

    def __init__(self, *, workers: int, max_threads: int, backlog: int) -> None:
        """Threads start on first use; at most ``backlog`` jobs wait."""
        self._workers = workers
        self._max_threads = max_threads
        self._jobs: queue.Queue[Job | None] = queue.Queue(maxsize=backlog)
        self._lock = threading.Lock()
        self._live = 0  # threads counted as workers
        self._total = 0  # threads alive, written-off ones included

    @property
    def jammed(self) -> bool:
        """Every thread the pool may have is written off as stuck."""
        with self._lock:
            return self._live == 0 and self._total >= self._max_threads

    def submit(self, fn: Callable[[], Any]) -> Job:
        """Queue ``fn``; its futures fail with PoolBusy at once if no thread can take it."""
        job = Job(fn, asyncio.get_running_loop())
        try:
            if self.jammed:
                raise queue.Full
            self._jobs.put_nowait(job)
        except queue.Full:
            job.started.set_exception(PoolBusy("notice composer busy or stuck"))
            job.result.cancel()
            return job
        self._grow()
        return job

    def abandon(self, job: Job) -> None:
        """``job`` overran after it started: write its thread off and start a replacement."""
        with self._lock:
            if job.abandoned or not job.started.done() or job.result.done():
                return
            job.abandoned = True
            self._live -= 1
        self._grow()
        if self.jammed:  # nobody will take the waiting jobs: let their callers fall back now
            while True:
                try:
                    waiting = self._jobs.get_nowait()
                except queue.Empty:
                    break
                if waiting is not None and not waiting.started.done():
                    waiting.started.set_exception(PoolBusy("notice composer stuck"))

    def close(self) -> None:
        """Ask idle threads to end (a stuck one stays, as a daemon thread)."""
        with self._lock:
            live = self._live
        for _ in range(live):
            with contextlib.suppress(queue.Full):
                self._jobs.put_nowait(None)

    def _grow(self) -> None:
        with self._lock:
            if self._live >= self._workers or self._total >= self._max_threads:
                return
            self._live += 1
            self._total += 1
        threading.Thread(target=self._work, name="qmgrd-notice", daemon=True).start()

    def _work(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                with self._lock:
                    self._live -= 1
                    self._total -= 1
                return
            if job.result.done():  # its waiter gave up before it started: stale work
                continue
            loop = job.result.get_loop()
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                loop.call_soon_threadsafe(_resolve, job.started, True, None)
            try:
                ok, value = True, job.fn()
            except BaseException as exc:  # handed back to the awaiting coroutine
                ok, value = False, exc
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(_resolve, job.result, ok, value)
            with self._lock:
                if job.abandoned:  # replaced while it ran: leave the work to the replacement
                    self._total -= 1
                    return


def _resolve(future: asyncio.Future[Any], ok: bool, value: Any) -> None:
    if future.done():  # timed out and cancelled by wait_for
        return
    if ok:
        future.set_result(value)
    else:
        future.set_exception(value)


class NoticeComposer:
    """Builds notices, bounded in time, off the spool's workers (see the module doc)."""

    def __init__(self, ctx: EngineContext) -> None:
        """``ctx``: the engine's shared state (settings are read at each notice)."""
        self.ctx = ctx
        self.timeout = COMPOSE_TIMEOUT
        self.queue_timeout = QUEUE_TIMEOUT
        self.attempts = COMPOSE_ATTEMPTS
        self.pool = ThreadPool(
            workers=COMPOSE_WORKERS, max_threads=COMPOSE_MAX_THREADS, backlog=COMPOSE_BACKLOG
        )
        self.compose_full = compose_dsn  # replaced by tests that simulate a hostile message

    async def compose(
        self, msg: ActiveMessage, records: Sequence[ReasonRecord], kind: NoticeKind, now: float
    ) -> bytes:
        """The notice's bytes; the minimal notice if the full one cannot be built in time."""
        log = self.ctx.log
        for attempt in range(1, self.attempts + 1):
            job = self.pool.submit(lambda: self._full(msg, records, kind, now))
            try:
                # The time bound runs from the start of the work: a burst of bounces queues
                # up without timing out; waiting for a thread is bounded apart.
                await asyncio.wait_for(asyncio.shield(job.started), self.queue_timeout)
                return await asyncio.wait_for(asyncio.shield(job.result), self.timeout)
            except TimeoutError:
                self.pool.abandon(job)
                job.result.cancel()
                log.error(
                    "notice composition timed out", queue_id=msg.queue_id, kind=kind,
                    attempt=attempt, timeout=self.timeout,
                )
            except Exception as exc:  # hostile content: contained to this notice
                log.error(
                    "notice composition failed", queue_id=msg.queue_id, kind=kind,
                    attempt=attempt, error=repr(exc),
                )
        log.warning("sending a minimal notice without the original", queue_id=msg.queue_id,
                    kind=kind)
        return minimal_dsn(self.ctx.settings.myhostname, msg, records, kind, now)

    def _full(
        self, msg: ActiveMessage, records: Sequence[ReasonRecord], kind: NoticeKind, now: float
    ) -> bytes:
        """The full notice (pool thread): reads the original and composes."""
        qf = msg.qf
        s = self.ctx.settings
        # Only what compose_dsn can use: past bounce_size_limit it attaches the headers only,
        # so a 50 MB original costs a 50 kB read (+2: enough to see that it is over the limit).
        limit = max(1, s.bounce_size_limit)
        content = QueueFileContent(
            msg.path, qf.content_offset, min(qf.content_size, limit + 2)
        ).read()
        recipients = [
            DsnRecipient(
                final_recipient=r.address,
                action="failed" if kind == "failure" else "delayed",
                status=r.dsn,
                diagnostic_code=r.reason,
                remote_mta=_relay_host(r.relay),
                original_recipient=r.orcpt,
                last_attempt=datetime.fromtimestamp(r.time, UTC),
            )
            for r in records
        ]
        return self.compose_full(
            reporting_mta=s.myhostname,
            queue_id=msg.queue_id,
            original_sender=qf.sender,
            arrival_time=datetime.fromtimestamp(qf.arrival_time, UTC),
            recipients=recipients,
            original_headers=content,
            original_message=None if kind == "delay" or qf.ret == "HDRS" else content,
            kind=kind,
            envid=qf.envid,
            now=datetime.fromtimestamp(now, UTC),
            delay_seconds=now - qf.arrival_time,
            lifetime_seconds=s.maximal_queue_lifetime,
            bounce_size_limit=limit,
        )

    def close(self) -> None:
        """Let the pool's idle threads end."""
        self.pool.close()


def minimal_dsn(
    myhostname: str,
    msg: ActiveMessage,
    records: Sequence[ReasonRecord],
    kind: NoticeKind,
    now: float,
) -> bytes:
    """An RFC 3464 report from the envelope and reasons only (the original is not read)."""
    host = _safe(myhostname)
    when = format_datetime(datetime.fromtimestamp(now, UTC))
    boundary = f"{msg.queue_id}.{int(now)}/{host}"
    subject = (
        "Undelivered Mail Returned to Sender"
        if kind == "failure"
        else "Delayed Mail (still being retried)"
    )
    action = "failed" if kind == "failure" else "delayed"
    text = [
        f"This is the mail system at host {host}.",
        "",
        "Your message could not be delivered to one or more recipients."
        if kind == "failure"
        else "Your message could not be delivered yet; the mail system keeps trying.",
        "The original message could not be attached to this report.",
        "",
    ]
    text += [f"<{_safe(r.address)}>: {_safe(r.reason)}" for r in records]
    report = [
        f"Reporting-MTA: dns; {host}",
        f"X-Queue-ID: {msg.queue_id}",
        f"Arrival-Date: {format_datetime(datetime.fromtimestamp(msg.qf.arrival_time, UTC))}",
    ]
    for r in records:
        report += [
            "",
            f"Final-Recipient: rfc822; {_safe(r.address)}",
            f"Action: {action}",
            f"Status: {_safe(r.dsn)}",
            f"Diagnostic-Code: X-Postfix; {_safe(r.reason)}",
        ]
    lines = [
        f"From: MAILER-DAEMON@{host} (Mail Delivery System)",
        f"To: <{_safe(msg.qf.sender)}>",
        f"Subject: {subject}",
        f"Date: {when}",
        f"Message-ID: <{int(now)}.{msg.queue_id}@{host}>",
        "Auto-Submitted: auto-replied",
        "MIME-Version: 1.0",
        "Content-Type: multipart/report; report-type=delivery-status;",
        f'\tboundary="{boundary}"',
        "",
        "This is a MIME-encapsulated message.",
        "",
        f"--{boundary}",
        "Content-Description: Notification",
        "Content-Type: text/plain; charset=us-ascii",
        "",
        *text,
        "",
        f"--{boundary}",
        "Content-Description: Delivery report",
        "Content-Type: message/delivery-status",
        "",
        *report,
        "",
        f"--{boundary}--",
        "",
    ]
    return "\r\n".join(lines).encode("ascii")


def _safe(text: str) -> str:
    """Printable ASCII only, on one line, bounded (anything else becomes ``?``)."""
    out = "".join(c if " " <= c <= "~" else "?" for c in text[:_REASON_MAX])
    return out.strip() or "?"


def _relay_host(relay: str) -> str | None:
    if not relay or relay == "none":
        return None
    return relay.split("[", 1)[0] or None
