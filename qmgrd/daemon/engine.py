"""The engine: the asyncio shell that drives the pure scheduler, the spool and the agents.

Theory of operation (DESIGN §4)
-------------------------------
One coroutine, :meth:`Engine.run`, owns every scheduling decision. Each pass of
its loop reads the clock once, then:

1. runs the scheduler's due timers and, every ``queue_run_delay``, starts a
   deferred-queue scan;
2. applies the scheduler's events (finished messages, recipients deferred at a
   dead destination, state changes for the log);
3. feeds the active queue: while fewer than ``qmgr_message_active_limit``
   messages are in core (or being loaded), moves the next queue file from
   ``incoming/`` or a due one from ``deferred/`` (alternating, as Postfix) into
   ``active/``, parses its envelope and registers it with the scheduler;
4. serves the scheduler's read requests (recipient batches), resolving each
   recipient to (transport, nexthop, queue);
5. drains: asks the scheduler for entries until it has none and starts one
   delivery task per entry.

Then it sleeps until something happens: a delivery or a file job completes, the
listener commits a message, a control request arrives, or the scheduler's next
deadline passes. Nothing polls.

File work runs in worker threads through :class:`IoBatcher`, so one delivery
costs one thread hop (bounce reasons, defer reasons and done marks together)
however many recipients it carried, and concurrent completions share hops.

Ordering rules that keep mail safe:
- a bounced recipient's reason is durable in ``bounce/`` before its done mark;
- a sent recipient is marked done only after the agent reported it sent;
- a message is removed or moved to ``deferred/`` only after the scheduler
  reported it finished, which it does only after every entry completed, and
  every entry's file work finished before the scheduler heard of it;
- a file job that fails (disk full, permissions) leaves recipients ``R`` and
  the message flagged deferred, so the next pass retries them: at worst a
  recipient is delivered twice, never lost.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from qmgrd.core.backoff import delay_warning_due, is_expired, next_attempt
from qmgrd.core.entry import Entry
from qmgrd.core.events import (
    DestinationDead,
    DestinationRevived,
    MessageDone,
    RecipientsDeferred,
    TransportDead,
    TransportRevived,
)
from qmgrd.core.message import Message, ReadRequest, ResolvedRecipient
from qmgrd.core.params import TransportParams
from qmgrd.core.resolve import Resolver, queue_name
from qmgrd.core.scheduler import Scheduler
from qmgrd.daemon.clock import Clock
from qmgrd.daemon.iobatch import IoBatcher
from qmgrd.daemon.settings import EngineSettings
from qmgrd.delivery.agent import (
    Agent,
    DeliveryRequest,
    DeliveryResult,
    Outcome,
    Recipient,
    RecipientResult,
)
from qmgrd.delivery.dsn import DsnRecipient, compose_dsn, wants_notice
from qmgrd.errors import SpoolError
from qmgrd.log import get_logger
from qmgrd.spool import (
    WARNED,
    Envelope,
    QueueFile,
    QueueFileContent,
    ReasonRecord,
    RecipientRecord,
    RecipientSpec,
    Spool,
    read_content,
    rewrite_warn_time,
)
from qmgrd.spool.records import mark_done

__all__ = ["ActiveMessage", "Engine", "EngineStats"]

_CRASH_DSN = "4.3.0"
_CRASH_REASON = "unknown mail transport error"
_NO_TRANSPORT_REASON = "mail transport unavailable"


@dataclass(slots=True, eq=False)
class ActiveMessage:
    """The engine's record of one message in the active queue (the core's ``payload``)."""

    queue_id: str
    path: Path
    qf: QueueFile
    queued_time: float
    deferred: bool = False  # some recipient was deferred in this pass
    bounced: bool = False  # the bounce log holds reasons not yet returned to the sender
    corrupt: str | None = None  # the file turned out unreadable mid-pass
    pending_defer: list[ReasonRecord] = field(default_factory=list)  # not yet in defer/


@dataclass(slots=True)
class EngineStats:
    """Counters for status, metrics and benchmarks."""

    messages_loaded: int = 0
    messages_removed: int = 0
    messages_deferred: int = 0
    messages_bounced: int = 0
    recipients_sent: int = 0
    recipients_deferred: int = 0
    recipients_bounced: int = 0
    deliveries: int = 0


@dataclass(frozen=True, slots=True)
class _FinishOutcome:
    action: str  # "removed" | "deferred" | "expired" | "corrupt" | "error"
    notices: tuple[str, ...] = ()  # queue ids of notices enqueued
    detail: str = ""
    expired_recipients: tuple[ReasonRecord, ...] = ()
    next_attempt: float = 0.0


class Engine:
    """Drives the scheduler: feed, read, select, deliver, complete (see the module doc)."""

    def __init__(
        self,
        *,
        settings: EngineSettings,
        spool: Spool,
        scheduler: Scheduler,
        resolver: Resolver,
        transport_params: Callable[[str], TransportParams],
        agents: Mapping[str, Agent],
        clock: Clock,
        io: IoBatcher | None = None,
    ) -> None:
        """Collaborators are passed in so tests can hand in fakes (STYLE §9)."""
        self.settings = settings
        self.spool = spool
        self.scheduler = scheduler
        self.resolver = resolver
        self.transport_params = transport_params
        self.agents: dict[str, Agent] = dict(agents)
        self.clock = clock
        self.io = io or IoBatcher()
        self.stats = EngineStats()
        self.log = get_logger("qmgr")
        self.smtp_log = get_logger("smtp")
        self._kick = asyncio.Event()
        self._stopping = False
        self._incoming: deque[str] = deque()
        self._deferred: deque[str] = deque()
        self._known: set[str] = set()  # ids queued for loading, loading, or in core
        self._loading = 0
        self._prefer_incoming = True
        self._deferred_scan_due = 0.0
        self._deferred_scan_running = False
        self._deferred_scan_again = False
        self._flush_next_scan = False
        self._tasks: set[asyncio.Task[Any]] = set()
        self._deliveries: set[asyncio.Task[Any]] = set()
        self._passes = 0
        self._pass_cond = asyncio.Condition()

    # ------------------------------------------------------------------ wakeups

    def wakeup(self) -> None:
        """Make the loop run a pass now (after an event outside the engine)."""
        self._kick.set()

    def notify_incoming(self, queue_id: str) -> None:
        """The listener committed ``queue_id`` to ``incoming/``: pick it up soon."""
        if queue_id not in self._known:
            self._known.add(queue_id)
            self._incoming.append(queue_id)
        self._kick.set()

    def request_deferred_scan(self, *, flush: bool = False) -> None:
        """Scan ``deferred/`` at the next pass (``flush``: ignore next-attempt times)."""
        self._deferred_scan_due = 0.0
        self._flush_next_scan = self._flush_next_scan or flush
        self._kick.set()

    def flush(self) -> None:
        """``postqueue -f``: forget dead destinations and retry every deferred message now."""
        self.scheduler.flush(self.clock.now())
        self.request_deferred_scan(flush=True)

    @property
    def idle(self) -> bool:
        """Nothing in core, nothing queued for loading, no file work pending."""
        return (
            self.scheduler.message_count == 0
            and not self._incoming
            and not self._deferred
            and self._loading == 0
            and not self._tasks
            and not self._deliveries
        )

    async def wait_idle(self) -> None:
        """Wait until a pass that began after this call ends with nothing in core or pending."""
        start = self._passes
        async with self._pass_cond:
            await self._pass_cond.wait_for(lambda: self._passes > start + 1 and self.idle)

    # ------------------------------------------------------------------ lifecycle

    async def recover(self) -> None:
        """Startup: drop dead writers' temporaries, move ``active/`` back to ``incoming/``."""
        now = self.clock.now()

        def work() -> tuple[int, list[str]]:
            self.spool.ensure_dirs()
            temps = self.spool.remove_temp_files()
            moved = []
            for queue_id in self.spool.list_ids("active"):
                try:
                    self.spool.move(queue_id, "active", "incoming", mtime=now)
                    moved.append(queue_id)
                except FileNotFoundError:
                    continue
            return temps, moved

        temps, moved = await self.io.submit(work)
        if temps:
            self.log.info("removed unfinished queue files of an earlier run", count=temps)
        if moved:
            self.log.info("recovered messages from the active queue", count=len(moved))

    async def run(self) -> None:
        """The engine's loop; returns after :meth:`stop` once in-flight work is settled."""
        await self.recover()
        await self._scan_incoming()
        try:
            while not self._stopping:
                self._kick.clear()
                now = self.clock.now()
                self._pass(now)
                self._passes += 1
                async with self._pass_cond:
                    self._pass_cond.notify_all()
                await self._sleep(now)
        finally:
            await self._shutdown()

    def stop(self) -> None:
        """Stop dispatching; :meth:`run` returns once deliveries finish or time out."""
        self._stopping = True
        self._kick.set()

    async def _sleep(self, now: float) -> None:
        deadline = self.scheduler.next_deadline()
        if self._deferred_scan_due and (deadline is None or self._deferred_scan_due < deadline):
            deadline = self._deferred_scan_due
        timeout = None if deadline is None else max(0.0, deadline - now)
        if self._kick.is_set():
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._kick.wait(), timeout)

    async def _shutdown(self) -> None:
        if self._deliveries:
            _done, pending = await asyncio.wait(
                set(self._deliveries), timeout=self.settings.shutdown_timeout
            )
            for task in pending:
                task.cancel()
            if pending:
                await asyncio.gather(*pending, return_exceptions=True)
                self.log.warning(
                    "deliveries cancelled at shutdown; their recipients stay queued",
                    count=len(pending),
                )
        if self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)
        await self.io.wait_idle()
        for agent in self.agents.values():
            try:
                await agent.close()
            except Exception as exc:  # closing must not hide the shutdown
                self.log.warning("agent close failed", error=repr(exc))

    def _spawn(self, coro: Any, *, delivery: bool = False) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        bucket = self._deliveries if delivery else self._tasks
        bucket.add(task)
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        self._deliveries.discard(task)
        if not task.cancelled() and task.exception() is not None:
            exc = task.exception()
            self.log.error("internal error in engine task", error=repr(exc))
        self._kick.set()

    # ------------------------------------------------------------------ one pass

    def _pass(self, now: float) -> None:
        self.scheduler.run_timers(now)
        if self._deferred_scan_due <= now and not self._deferred_scan_running:
            self._deferred_scan_due = now + self.settings.queue_run_delay
            self._deferred_scan_running = True
            self._spawn(self._scan_deferred(now, flush=self._flush_next_scan))
            self._flush_next_scan = False
        self._apply_events(now)
        self._feed(now)
        self._serve_reads()
        self._drain(now)
        self._apply_events(now)

    def _apply_events(self, now: float) -> None:
        for event in self.scheduler.pop_events():
            if isinstance(event, MessageDone):
                msg = _active(event.message)
                self._spawn(self._finish(msg))
            elif isinstance(event, RecipientsDeferred):
                msg = _active(event.message)
                self._defer_unattempted(msg, event.recipients, event.status, event.reason, now)
            elif isinstance(event, DestinationDead):
                self.log.warning(
                    "destination dead",
                    transport=event.transport,
                    nexthop=event.nexthop,
                    status=event.status,
                    reason=event.reason,
                )
            elif isinstance(event, DestinationRevived):
                self.log.info(
                    "destination revived", transport=event.transport, queue=event.queue_name
                )
            elif isinstance(event, TransportDead):
                self.log.warning(
                    "transport dead",
                    transport=event.transport,
                    status=event.status,
                    reason=event.reason,
                )
            elif isinstance(event, TransportRevived):
                self.log.info("transport revived", transport=event.transport)

    # ------------------------------------------------------------------ feeding

    async def _scan_incoming(self) -> None:
        ids = await self.io.submit(lambda: self.spool.list_ids("incoming"))
        for queue_id in ids:
            if queue_id not in self._known:
                self._known.add(queue_id)
                self._incoming.append(queue_id)
        self._kick.set()

    async def _scan_deferred(self, now: float, *, flush: bool) -> None:
        try:
            if flush:
                ids = await self.io.submit(lambda: self.spool.list_ids("deferred"))
            else:
                ids = await self.io.submit(lambda: self.spool.due_ids("deferred", now))
        except OSError as exc:
            self.log.error("cannot scan the deferred queue", error=str(exc))
            ids = []
        finally:
            self._deferred_scan_running = False
        for queue_id in ids:
            if queue_id not in self._known:
                self._known.add(queue_id)
                self._deferred.append(queue_id)

    def _feed(self, now: float) -> None:
        limit = self.settings.qmgr_message_active_limit
        while (
            not self._stopping
            and self.scheduler.message_count + self._loading < limit
            and (self._incoming or self._deferred)
        ):
            if self._deferred and (not self._incoming or not self._prefer_incoming):
                queue_id, src = self._deferred.popleft(), "deferred"
            else:
                queue_id, src = self._incoming.popleft(), "incoming"
            # Alternate while there is room; when full, incoming gets the next slot (notes §1).
            self._prefer_incoming = src == "deferred"
            self._loading += 1
            self._spawn(self._load(queue_id, src, now))
        if self.scheduler.message_count + self._loading >= limit:
            self._prefer_incoming = True

    async def _load(self, queue_id: str, src: str, now: float) -> None:
        def work() -> tuple[Path, QueueFile | SpoolError, bool] | None:
            try:
                path = self.spool.move(queue_id, src, "active")
            except FileNotFoundError:
                return None  # deleted or moved by an operator meanwhile
            # A new pass: the defer log describes only the current pass (notes §9).
            self.spool.remove_reasons("defer", queue_id)
            bounced = bool(self.spool.read_reasons("bounce", queue_id))
            try:
                return path, QueueFile.open(path), bounced
            except SpoolError as exc:
                return path, exc, bounced

        try:
            loaded = await self.io.submit(work)
        except OSError as exc:
            self.log.error(
                "cannot move message to the active queue", queue_id=queue_id, error=str(exc)
            )
            self._known.discard(queue_id)
            self._loading -= 1
            return
        self._loading -= 1
        if loaded is None:
            self._known.discard(queue_id)
            return
        path, qf, bounced = loaded
        if isinstance(qf, SpoolError):
            await self._quarantine(queue_id, str(qf))
            return
        msg = ActiveMessage(queue_id, path, qf, queued_time=now, bounced=bounced)
        self.scheduler.message_create(
            queue_id,
            queued_time=now,
            rcpt_unread=qf.rcpt_count,
            rcpt_offset=qf.first_recipient_offset,
            payload=msg,
        )
        self.stats.messages_loaded += 1
        self.log.info(
            "queued",
            queue_id=queue_id,
            from_=f"<{qf.sender}>",
            size=qf.content_size,
            nrcpt=f"{qf.rcpt_count} (queue active)",
        )

    async def _quarantine(self, queue_id: str, reason: str) -> None:
        try:
            await self.io.submit(lambda: self.spool.quarantine("active", queue_id, reason))
        except OSError as exc:
            self.log.error(
                "cannot quarantine corrupt queue file", queue_id=queue_id, error=str(exc)
            )
        self._known.discard(queue_id)

    # ------------------------------------------------------------------ reading

    def _serve_reads(self) -> None:
        for request in self.scheduler.pop_reads():
            self._spawn(self._read(request))

    async def _read(self, request: ReadRequest) -> None:
        msg = _active(request.message)
        try:
            records, next_offset = await self.io.submit(
                lambda: msg.qf.read_recipients(request.offset, request.limit)
            )
        except (SpoolError, OSError) as exc:
            msg.corrupt = str(exc)
            self.log.error("cannot read recipients", queue_id=msg.queue_id, error=str(exc))
            self.scheduler.recipients_add(request.message, [], 0, self.clock.now())
            return
        resolved = [self._resolve(record) for record in records]
        self.scheduler.recipients_add(request.message, resolved, next_offset, self.clock.now())

    def _resolve(self, record: RecipientRecord) -> ResolvedRecipient:
        resolved = self.resolver.resolve(record.address)
        params = self.transport_params(resolved.transport)
        name = queue_name(
            resolved,
            recipient_limit=params.destination_recipient_limit,
            recipient_delimiter=self.settings.recipient_delimiter,
        )
        return ResolvedRecipient(
            record.address, record.offset, resolved.transport, resolved.nexthop, name, record
        )

    # ------------------------------------------------------------------ delivering

    def _drain(self, now: float) -> None:
        if self._stopping:
            return
        while True:
            entry = self.scheduler.select(now)
            if entry is None:
                return
            agent = self.agents.get(entry.transport)
            if agent is None:
                self.scheduler.transport_failed(
                    entry.transport, _CRASH_DSN, _NO_TRANSPORT_REASON, now, entry=entry
                )
                continue
            self._spawn(self._deliver(entry, agent, now), delivery=True)

    async def _deliver(self, entry: Entry, agent: Agent, started: float) -> None:
        msg = _active(entry.message)
        qf = msg.qf
        recipients = tuple(_agent_recipient(r) for r in entry.recipients)
        request = DeliveryRequest(
            queue_id=msg.queue_id,
            transport=entry.transport,
            nexthop=entry.nexthop,
            sender=qf.sender,
            recipients=recipients,
            content=QueueFileContent(msg.path, qf.content_offset, qf.content_size),
            smtputf8=qf.smtputf8,
            body_8bitmime=qf.body == "8BITMIME",
            envid=qf.envid,
            ret=qf.ret,
            cache_load=entry.cache_load,
            cache_store=entry.cache_store,
        )
        crashed = False
        try:
            result = await agent.deliver(request)
        except asyncio.CancelledError:
            # Shutdown: the recipients stay R in active/ and are recovered at the next start.
            raise
        except Exception as exc:
            self.log.error(
                "delivery agent failed",
                queue_id=msg.queue_id,
                transport=entry.transport,
                error=repr(exc),
            )
            crashed = True
            result = DeliveryResult(
                tuple(
                    RecipientResult(r, Outcome.DEFERRED, _CRASH_DSN, _CRASH_REASON)
                    for r in recipients
                )
            )
        result = _complete(result, recipients)
        now = self.clock.now()
        await self._record(msg, result, now)
        self._log_results(msg, entry, result, started, now)
        self.stats.deliveries += 1
        hop = (result.hop.dsn, result.hop.reason) if result.hop else None
        self.scheduler.entry_done(entry, hop_failure=hop, crashed=crashed, now=now)
        self._kick.set()

    async def _record(self, msg: ActiveMessage, result: DeliveryResult, now: float) -> None:
        """Make one delivery's outcome durable: bounce reasons, then done marks, defer reasons."""
        bounce: list[ReasonRecord] = []
        done: list[int] = []
        for r in result.recipients:
            if r.outcome is Outcome.DEFERRED:
                msg.deferred = True
                msg.pending_defer.append(_reason(r, "delayed", now))
                continue
            done.append(r.recipient.offset)
            if r.outcome is Outcome.BOUNCED and wants_notice(r.recipient, "failure"):
                bounce.append(_reason(r, "failed", now))
        defer, msg.pending_defer = msg.pending_defer, []
        if bounce:
            msg.bounced = True
        spool = self.spool

        def work() -> None:
            if bounce:
                spool.append_reasons("bounce", msg.queue_id, bounce)
            if done:
                mark_done(msg.path, done)
            if defer:
                spool.append_reasons("defer", msg.queue_id, defer)

        try:
            await self.io.submit(work)
        except OSError as exc:
            # Nothing is lost: unmarked recipients stay R and the message is retried.
            msg.deferred = True
            msg.pending_defer.extend(defer)
            self.log.error(
                "cannot record delivery results; recipients stay queued",
                queue_id=msg.queue_id,
                error=str(exc),
            )

    def _defer_unattempted(
        self,
        msg: ActiveMessage,
        recipients: tuple[ResolvedRecipient, ...],
        status: str,
        reason: str,
        now: float,
    ) -> None:
        msg.deferred = True
        for rcpt in recipients:
            record = _record_of(rcpt)
            msg.pending_defer.append(
                ReasonRecord(rcpt.address, status, "delayed", reason, now, "none", record.orcpt)
            )
            self.stats.recipients_deferred += 1
            self.smtp_log.info(
                "deferred",
                queue_id=msg.queue_id,
                to=f"<{rcpt.address}>",
                relay="none",
                delay=_fmt(now - msg.qf.arrival_time),
                delays=_delays(msg, now, now, 0.0, 0.0),
                dsn=status,
                status="deferred",
                reply=reason,
            )

    def _log_results(
        self,
        msg: ActiveMessage,
        entry: Entry,
        result: DeliveryResult,
        started: float,
        now: float,
    ) -> None:
        delay = _fmt(now - msg.qf.arrival_time)
        delays = _delays(msg, started, now, result.conn_setup_time, result.transmission_time)
        for r in result.recipients:
            status = r.outcome.value
            if r.outcome is Outcome.SENT:
                self.stats.recipients_sent += 1
            elif r.outcome is Outcome.BOUNCED:
                self.stats.recipients_bounced += 1
            else:
                self.stats.recipients_deferred += 1
            self.smtp_log.info(
                status,
                queue_id=msg.queue_id,
                to=f"<{r.recipient.address}>",
                relay=r.relay,
                transport=entry.transport,
                delay=delay,
                delays=delays,
                dsn=r.dsn,
                status=status,
                reply=r.reply,
            )

    # ------------------------------------------------------------------ finishing

    async def _finish(self, msg: ActiveMessage) -> None:
        now = self.clock.now()
        try:
            outcome = await self.io.submit(lambda: self._finish_files(msg, now))
        except OSError as exc:
            # The file stays in active/; the next start (or pass) retries it.
            self.log.error(
                "cannot finish message; it stays in the active queue",
                queue_id=msg.queue_id,
                error=str(exc),
            )
            outcome = _FinishOutcome("error", detail=str(exc))
        self._known.discard(msg.queue_id)
        for notice_id in outcome.notices:
            self.notify_incoming(notice_id)
        if outcome.action == "removed":
            self.stats.messages_removed += 1
            self.log.info("removed", queue_id=msg.queue_id)
        elif outcome.action == "deferred":
            self.stats.messages_deferred += 1
            self.log.info(
                "deferred",
                queue_id=msg.queue_id,
                next_attempt=datetime.fromtimestamp(outcome.next_attempt, UTC).isoformat(),
            )
        elif outcome.action == "expired":
            for record in outcome.expired_recipients:
                self.smtp_log.info(
                    "expired",
                    queue_id=msg.queue_id,
                    to=f"<{record.address}>",
                    relay=record.relay,
                    delay=_fmt(now - msg.qf.arrival_time),
                    dsn=record.dsn,
                    status="expired, returned to sender",
                    reply=record.reason,
                )
            self.log.info("removed", queue_id=msg.queue_id)
            self.stats.messages_removed += 1
        elif outcome.action == "corrupt":
            self.log.warning("corrupt queue file", queue_id=msg.queue_id, reason=outcome.detail)
        for notice_id in outcome.notices:
            self.stats.messages_bounced += 1
            self.log.info("sender notification", queue_id=msg.queue_id, notice=notice_id)
        self._kick.set()

    def _finish_files(self, msg: ActiveMessage, now: float) -> _FinishOutcome:
        """Runs in a worker thread: bounces, then delete / defer / expire (notes §9)."""
        spool, qid, qf = self.spool, msg.queue_id, msg.qf
        if msg.pending_defer:
            spool.append_reasons("defer", qid, msg.pending_defer)
            msg.pending_defer = []
        if msg.corrupt is not None:
            spool.quarantine("active", qid, msg.corrupt)
            return _FinishOutcome("corrupt", detail=msg.corrupt)
        notices: list[str] = []
        if msg.bounced:
            records = spool.read_reasons("bounce", qid)
            if records and qf.sender:
                notices.append(self._enqueue_notice(msg, records, "failure", now))
            spool.remove_reasons("bounce", qid)
        if not msg.deferred:
            spool.remove("active", qid)
            spool.remove_reasons("defer", qid)
            return _FinishOutcome("removed", tuple(notices))
        s = self.settings
        if is_expired(
            now,
            qf.arrival_time,
            null_sender=not qf.sender,
            maximal_queue_lifetime=s.maximal_queue_lifetime,
            bounce_queue_lifetime=s.bounce_queue_lifetime,
        ):
            records = spool.read_reasons("defer", qid)
            expired = tuple(
                ReasonRecord(
                    r.address,
                    _failed_status(r.dsn),
                    "failed",
                    f"message expired: {r.reason}",
                    now,
                    r.relay,
                    r.orcpt,
                )
                for r in records
            )
            if expired and qf.sender:
                notices.append(self._enqueue_notice(msg, list(expired), "failure", now))
            spool.remove("active", qid)
            spool.remove_reasons("defer", qid)
            return _FinishOutcome("expired", tuple(notices), expired_recipients=expired)
        if (
            qf.sender
            and qf.warn_offset is not None
            and qf.warn_time is not None
            and qf.warn_time != WARNED
            and delay_warning_due(now, float(qf.warn_time))
        ):
            records = spool.read_reasons("defer", qid)
            if records:
                notices.append(self._enqueue_notice(msg, records, "delay", now))
            rewrite_warn_time(msg.path, qf.warn_offset, WARNED)
        when = next_attempt(now, qf.arrival_time, s.minimal_backoff_time, s.maximal_backoff_time)
        spool.move(qid, "active", "deferred", mtime=when)
        return _FinishOutcome("deferred", tuple(notices), next_attempt=when)

    def _enqueue_notice(
        self,
        msg: ActiveMessage,
        records: list[ReasonRecord],
        kind: str,
        now: float,
    ) -> str:
        """Compose a DSN for ``records`` and commit it to incoming/ (worker thread)."""
        qf = msg.qf
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
        s = self.settings
        body = compose_dsn(
            reporting_mta=s.myhostname,
            queue_id=msg.queue_id,
            original_sender=qf.sender,
            arrival_time=datetime.fromtimestamp(qf.arrival_time, UTC),
            recipients=recipients,
            original_headers=content,
            original_message=None if kind == "delay" or qf.ret == "HDRS" else content,
            kind="failure" if kind == "failure" else "delay",
            envid=qf.envid,
            now=datetime.fromtimestamp(now, UTC),
            delay_seconds=now - qf.arrival_time,
            lifetime_seconds=s.maximal_queue_lifetime,
        )
        envelope = Envelope(
            sender="",
            recipients=(RecipientSpec(qf.sender),),
            arrival_time=now,
            client_name="localhost",
            client_addr="127.0.0.1",
        )
        return self.spool.commit(envelope, body)


# ---------------------------------------------------------------------- helpers


def _active(message: Message) -> ActiveMessage:
    payload = message.payload
    assert isinstance(payload, ActiveMessage)
    return payload


def _record_of(rcpt: ResolvedRecipient) -> RecipientRecord:
    payload = rcpt.payload
    assert isinstance(payload, RecipientRecord)
    return payload


def _agent_recipient(rcpt: ResolvedRecipient) -> Recipient:
    record = _record_of(rcpt)
    return Recipient(record.address, record.offset, record.orcpt, record.notify)


def _complete(result: DeliveryResult, recipients: tuple[Recipient, ...]) -> DeliveryResult:
    """Guard the agent contract: every recipient handed out gets exactly one result."""
    seen = {id(r.recipient) for r in result.recipients}
    missing = [r for r in recipients if id(r) not in seen]
    if not missing:
        return result
    extra = tuple(
        RecipientResult(r, Outcome.DEFERRED, _CRASH_DSN, "delivery agent gave no result")
        for r in missing
    )
    return DeliveryResult(
        result.recipients + extra,
        result.hop,
        result.conn_setup_time,
        result.transmission_time,
        result.extra,
    )


def _reason(r: RecipientResult, action: str, now: float) -> ReasonRecord:
    return ReasonRecord(
        r.recipient.address,
        r.dsn,
        "failed" if action == "failed" else "delayed",
        r.reply,
        now,
        r.relay,
        r.recipient.orcpt,
    )


def _failed_status(dsn: str) -> str:
    """An expired deferral is returned as a permanent failure with the same detail."""
    return "5" + dsn[1:] if dsn[:1] == "4" else dsn


def _relay_host(relay: str) -> str | None:
    if not relay or relay == "none":
        return None
    return relay.split("[", 1)[0] or None


def _fmt(seconds: float) -> str:
    """Postfix's delay formatting: two significant decimals, no trailing zeros."""
    seconds = max(0.0, seconds)
    if seconds >= 10:
        return f"{seconds:.0f}"
    if seconds >= 0.1:
        return f"{seconds:.1f}".rstrip("0").rstrip(".") or "0"
    text = f"{seconds:.2f}".rstrip("0").rstrip(".")
    return text or "0"


def _delays(
    msg: ActiveMessage, started: float, now: float, conn_setup: float, transmission: float
) -> str:
    """``delays=a/b/c/d``: before active, in active, connection set-up, transmission."""
    before = msg.queued_time - msg.qf.arrival_time
    in_active = started - msg.queued_time
    return "/".join(_fmt(x) for x in (before, in_active, conn_setup, transmission))


def pid_alive(pid: int) -> bool:
    """Whether a process with this pid exists (used by the pid lock)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
