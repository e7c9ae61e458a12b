"""Notices: build bounce and delay notices without letting one message wedge the daemon.

Contract
--------
``NoticeComposer.compose(msg, records, kind, now) -> bytes`` returns the
bytes of a notice (``kind`` ``failure`` or ``delay``) for ``records`` of the
loaded message ``msg``, and never raises for anything the message contains:

1. the full notice (``qmgrd.delivery.dsn.compose_dsn``, with the original
   attached, or its headers only for RET=HDRS and delay notices) is built on
   the composer's **own** small pool of daemon threads, never on the spool's
   ``IoBatcher`` workers, and waited for at most ``timeout`` seconds
   (``asyncio.wait_for``);
2. a failure or a timeout is logged with the queue id and tried again, up to
   ``attempts`` times;
3. then :func:`minimal_dsn` is returned: a plain RFC 3464 report built here,
   from the envelope and the reason records only, that never reads the
   original's content (nothing in it can fail on hostile bytes).

A composition that hangs (a parser loop on a crafted header) keeps one pool
thread busy; the pool has ``workers`` threads and a bounded backlog, so the
damage is bounded: later notices time out or find the pool full and get the
minimal notice at once. The threads are daemon threads, so a hung one never
keeps the process from exiting (SIGTERM still stops the daemon in time).
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
from qmgrd.spool import ReasonRecord, read_content

__all__ = ["NoticeComposer", "NoticeKind", "ThreadPool", "minimal_dsn"]

NoticeKind = Literal["failure", "delay"]

COMPOSE_TIMEOUT = 30.0  # seconds one notice composition may take
COMPOSE_ATTEMPTS = 2  # full compositions tried before the minimal notice
COMPOSE_WORKERS = 2
COMPOSE_BACKLOG = 32
_REASON_MAX = 900  # characters of a diagnostic kept in the minimal notice


class PoolBusy(Exception):
    """Every composer thread is busy and the backlog is full."""


class ThreadPool:
    """A few daemon threads running blocking callables; results come back as futures."""

    def __init__(self, *, workers: int, backlog: int) -> None:
        """``workers`` threads (started on first use) and at most ``backlog`` waiting jobs."""
        self._workers = workers
        self._jobs: queue.Queue[tuple[Callable[[], Any], asyncio.Future[Any]] | None] = (
            queue.Queue(maxsize=backlog)
        )
        self._threads: list[threading.Thread] = []

    def submit(self, fn: Callable[[], Any]) -> asyncio.Future[Any]:
        """Run ``fn`` on a pool thread; the future fails with PoolBusy if the backlog is full."""
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        try:
            self._jobs.put_nowait((fn, future))
        except queue.Full:
            future.set_exception(PoolBusy("notice composer busy"))
            return future
        if len(self._threads) < self._workers:
            thread = threading.Thread(target=self._work, name="qmgrd-notice", daemon=True)
            self._threads.append(thread)
            thread.start()
        return future

    def close(self) -> None:
        """Ask idle threads to end (a hung one stays, as a daemon thread)."""
        for _ in self._threads:
            with contextlib.suppress(queue.Full):
                self._jobs.put_nowait(None)
        self._threads = []

    def _work(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            fn, future = job
            if future.done():  # its waiter timed out meanwhile: do not run stale work
                continue
            loop = future.get_loop()
            try:
                ok, value = True, fn()
            except BaseException as exc:  # handed back to the awaiting coroutine
                ok, value = False, exc
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                loop.call_soon_threadsafe(_resolve, future, ok, value)


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
        self.attempts = COMPOSE_ATTEMPTS
        self.pool = ThreadPool(workers=COMPOSE_WORKERS, backlog=COMPOSE_BACKLOG)
        self.compose_full = compose_dsn  # replaced by tests that simulate a hostile message

    async def compose(
        self, msg: ActiveMessage, records: Sequence[ReasonRecord], kind: NoticeKind, now: float
    ) -> bytes:
        """The notice's bytes; the minimal notice if the full one cannot be built in time."""
        log = self.ctx.log
        for attempt in range(1, self.attempts + 1):
            try:
                return await asyncio.wait_for(
                    self.pool.submit(lambda: self._full(msg, records, kind, now)), self.timeout
                )
            except TimeoutError:
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
        content = read_content(msg.path)
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
