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
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

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
from qmgrd.core.params import SchedulerParams, TransportParams
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
from qmgrd.delivery.dsn import DsnRecipient, NoticeKind, compose_dsn, wants_notice
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
_RETRY_DELAY = 5.0  # seconds before file work that failed (disk full, EIO) is tried again


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
    pending_op: str | None = None  # hold | delete | requeue, applied when the pass ends
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
    notices: tuple[tuple[str, str], ...] = ()  # (kind, queue id) of notices enqueued
    detail: str = ""
    expired_recipients: tuple[ReasonRecord, ...] = ()
    next_attempt: float = 0.0


class DeliveryObserver(Protocol):
    """Where the engine reports outcomes for metrics (``qmgrd.daemon.metrics.Metrics``)."""

    def record_delivery(self, transport: str, status: str, dsn: str, seconds: float) -> None:
        """One recipient outcome; ``seconds`` since the message arrived."""
        ...

    def record_attempt(self, transport: str, seconds: float) -> None:
        """One delivery attempt took ``seconds``."""
        ...


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
        self.metrics: DeliveryObserver | None = None
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
        self._flush_next_scan = False
        self._tasks: set[asyncio.Task[Any]] = set()
        self._deliveries: set[asyncio.Task[Any]] = set()
        self._pending_ops: dict[str, str] = {}  # ops for messages being loaded
        self._started_at = clock.now()
        self._passes = 0
        self._started = asyncio.Event()
        self._pass_cond = asyncio.Condition()
        # File work that failed (disk full, I/O error) is retried after retry_delay:
        # finishes of messages left in active/, and a rescan of incoming/ for messages
        # whose move to active/ failed (incoming/ is otherwise scanned only at start).
        self.retry_delay = _RETRY_DELAY
        self._finish_retries: list[tuple[float, ActiveMessage]] = []
        self._incoming_rescan_due = 0.0  # 0 = none pending

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
            and not self._finish_retries
            and not self._incoming_rescan_due
        )

    async def wait_started(self) -> None:
        """Wait until startup recovery is over: only then may new mail be accepted.

        Recovery removes the temporary files of writers that died; a listener
        started earlier could have a live commit's temporary file removed.
        """
        await self._started.wait()

    async def wait_idle(self) -> None:
        """Wait until a pass that began after this call ends with nothing in core or pending."""
        # Passes are synchronous, so any pass counted after ``start`` began after this call;
        # the kick makes sure one runs even when the engine sleeps with no deadline.
        start = self._passes
        self._kick.set()
        async with self._pass_cond:
            await self._pass_cond.wait_for(lambda: self._passes > start and self.idle)

    # ------------------------------------------------------------------ lifecycle

    async def recover(self) -> None:
        """Startup: drop dead writers' temporaries, move ``active/`` back to ``incoming/``."""
        now = self.clock.now()

        def work() -> tuple[int, list[str], int]:
            self.spool.ensure_dirs()
            temps = self.spool.remove_temp_files()
            self.spool.sweep_foreign()  # symlinks, FIFOs, stray names -> corrupt/ (logged)
            moved = []
            for queue_id in self.spool.list_ids("active"):
                try:
                    self.spool.move(queue_id, "active", "incoming", mtime=now)
                    moved.append(queue_id)
                except FileNotFoundError:
                    continue
            return temps, moved, self._remove_orphan_reasons()

        temps, moved, orphans = await self.io.submit(work)
        if temps:
            self.log.info("removed unfinished queue files of an earlier run", count=temps)
        if orphans:
            self.log.info("removed reason logs of messages no longer queued", count=orphans)
        if moved:
            self.log.info("recovered messages from the active queue", count=len(moved))

    def _remove_orphan_reasons(self) -> int:
        """Delete defer/bounce logs whose message is gone (a crash between the two unlinks)."""
        live: set[str] = set()
        for queue in ("incoming", "active", "deferred", "hold", "corrupt"):
            live.update(self.spool.list_ids(queue))
        removed = 0
        for kind in ("defer", "bounce"):
            for queue_id in self.spool.list_ids(kind):
                if queue_id not in live and self.spool.remove_reasons(kind, queue_id):
                    removed += 1
        return removed

    async def run(self) -> None:
        """The engine's loop; returns after :meth:`stop` once in-flight work is settled."""
        try:
            await self.recover()
            await self._scan_incoming()
        finally:
            self._started.set()
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
        retry = self._next_retry()
        if retry is not None and (deadline is None or retry < deadline):
            deadline = retry
        timeout = None if deadline is None else max(0.0, deadline - now)
        if self._kick.is_set():
            return
        # asyncio.timeout, not wait_for: on 3.11 wait_for wraps the wait in a new task per pass.
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await self._kick.wait()

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
        if self._finish_retries or self._incoming_rescan_due:
            self._run_retries(now)
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
        try:
            ids = await self.io.submit(lambda: self.spool.list_ids("incoming"))
        except (OSError, SpoolError) as exc:
            self.log.error("cannot scan the incoming queue", error=str(exc))
            self._incoming_rescan_due = self.clock.now() + self.retry_delay
            return
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
        except (OSError, SpoolError) as exc:
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
            except SpoolError:
                if not self.spool.path(src, queue_id).exists():
                    return None  # deleted or moved by an operator meanwhile
                raise
            try:
                # A new pass: the defer log describes only the current pass (notes §9).
                self.spool.remove_reasons("defer", queue_id)
                bounced = bool(self.spool.read_reasons("bounce", queue_id))
            except SpoolError:
                self.spool.move(queue_id, "active", src)  # back where a retry finds it
                raise
            try:
                return path, QueueFile.open(path), bounced
            except SpoolError as exc:
                return path, exc, bounced

        try:
            loaded = await self.io.submit(work)
        except (OSError, SpoolError) as exc:
            self.log.error(
                "cannot move message to the active queue", queue_id=queue_id, error=str(exc)
            )
            self._known.discard(queue_id)
            self._loading -= 1
            if src == "incoming" and not self._incoming_rescan_due:
                # deferred/ is rescanned every queue_run_delay; incoming/ needs a retry.
                self._incoming_rescan_due = self.clock.now() + self.retry_delay
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
        msg.pending_op = self._pending_ops.pop(queue_id, None)
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
        except (OSError, SpoolError) as exc:
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
            if _active(entry.message).pending_op is not None:
                # Held, deleted or requeued by the operator: hand nothing more out; the
                # recipients stay R (a "crash" gives no feedback and marks nothing).
                self.scheduler.entry_done(entry, crashed=True, now=now)
                continue
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
        except (OSError, SpoolError) as exc:
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
                ReasonRecord(
                    rcpt.address,
                    status,
                    "delayed",
                    reason,
                    now,
                    "none",
                    record.orcpt,
                    tuple(sorted(record.notify)),
                )
            )
            self.stats.recipients_deferred += 1
            if self.metrics is not None:
                self.metrics.record_delivery(
                    rcpt.transport, "deferred", status, now - msg.qf.arrival_time
                )
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
        metrics = self.metrics
        if metrics is not None:
            metrics.record_attempt(entry.transport, now - started)
            for r in result.recipients:
                metrics.record_delivery(
                    entry.transport, r.outcome.value, r.dsn, now - msg.qf.arrival_time
                )
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
        except (OSError, SpoolError) as exc:
            # The file stays in active/ (a move or unlink is all or nothing) and the
            # finish is retried after retry_delay; a notice it may have enqueued
            # already is found by the rescan of incoming/ that goes with the retry.
            retry = now + self.retry_delay
            self.log.error(
                "cannot finish message; it stays in the active queue",
                queue_id=msg.queue_id,
                error=str(exc),
                retry=datetime.fromtimestamp(retry, UTC).isoformat(),
            )
            self._finish_retries.append((retry, msg))
            if not self._incoming_rescan_due:
                self._incoming_rescan_due = retry
            self._kick.set()
            return
        self._known.discard(msg.queue_id)
        for _kind, notice_id in outcome.notices:
            self.notify_incoming(notice_id)
        if outcome.action in _OP_LOG:
            self._op_done(msg.queue_id, outcome.action)
        elif outcome.action == "removed":
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
                if self.metrics is not None:
                    self.metrics.record_delivery(
                        "", "expired", record.dsn, now - msg.qf.arrival_time
                    )
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
        for kind, notice_id in outcome.notices:
            # Postfix's shape: "ID: sender non-delivery notification: NOTICE_ID".
            what = "non-delivery" if kind == "failure" else "delay"
            if kind == "failure":
                self.stats.messages_bounced += 1
            self.log.info(f"sender {what} notification: {notice_id}", queue_id=msg.queue_id)
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
        if msg.pending_op is not None:
            return _FinishOutcome(self._apply_op_files(msg.pending_op, qid, "active", now))
        notices: list[tuple[str, str]] = []
        if msg.bounced:
            records = spool.read_reasons("bounce", qid)
            if records and qf.sender:
                notices.append(("failure", self._enqueue_notice(msg, records, "failure", now)))
            msg.bounced = False  # a retry of this finish must not send the notice again
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
                    r.notify,
                )
                for r in records
            )
            wanted = _wanted(expired, "failure")
            if wanted and qf.sender:
                notices.append(("failure", self._enqueue_notice(msg, wanted, "failure", now)))
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
            records = _wanted(spool.read_reasons("defer", qid), "delay")
            if records:
                notices.append(("delay", self._enqueue_notice(msg, records, "delay", now)))
            rewrite_warn_time(msg.path, qf.warn_offset, WARNED)
        when = next_attempt(now, qf.arrival_time, s.minimal_backoff_time, s.maximal_backoff_time)
        spool.move(qid, "active", "deferred", mtime=when)
        return _FinishOutcome("deferred", tuple(notices), next_attempt=when)

    def _next_retry(self) -> float | None:
        times = [when for when, _msg in self._finish_retries]
        if self._incoming_rescan_due:
            times.append(self._incoming_rescan_due)
        return min(times) if times else None

    def _run_retries(self, now: float) -> None:
        """Start the file work whose retry time has come (see ``retry_delay``)."""
        if self._incoming_rescan_due and self._incoming_rescan_due <= now:
            self._incoming_rescan_due = 0.0
            self._spawn(self._scan_incoming())
        due = [msg for when, msg in self._finish_retries if when <= now]
        if due:
            self._finish_retries = [(w, m) for w, m in self._finish_retries if w > now]
            for msg in due:
                self._spawn(self._finish(msg))

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

    # ------------------------------------------------------------------ control

    def request_incoming_scan(self) -> None:
        """Look at ``incoming/`` again (files dropped there by hand or by ``requeue``)."""
        self._spawn(self._scan_incoming())

    def _enqueue_deferred(self, queue_id: str) -> None:
        if queue_id not in self._known:
            self._known.add(queue_id)
            self._deferred.append(queue_id)
        self._kick.set()

    async def flush_destination(self, domain: str) -> int:
        """Forget that ``domain`` is dead and retry the deferred mail that has recipients there."""
        now = self.clock.now()
        domain = domain.strip().lower().strip("[]")
        self.scheduler.flush_destination(domain, now)

        def work() -> list[str]:
            matches = []
            for queue_id in self.spool.list_ids("deferred"):
                try:
                    qf = self.spool.open("deferred", queue_id)
                    recipients = qf.read_all_recipients()
                except (SpoolError, OSError):
                    continue
                if any(r.address.rpartition("@")[2].lower() == domain for r in recipients):
                    matches.append(queue_id)
            return matches

        ids = await self.io.submit(work)
        for queue_id in ids:
            self._enqueue_deferred(queue_id)
        return len(ids)

    async def flush_message(self, queue_id: str) -> bool:
        """Retry one deferred message now; False if it is not in ``deferred/``."""
        path = self.spool.path("deferred", queue_id)
        exists = await self.io.submit(path.is_file)
        if exists:
            self._enqueue_deferred(queue_id)
        return exists

    def status(self) -> dict[str, Any]:
        """A JSON-ready snapshot of what is in core (the control socket's ``status``)."""
        transports = []
        for transport in self.scheduler.transports():
            queues = []
            for queue in transport.queues.values():
                window = queue.window
                state = "dead" if window.throttled else "suspended" if window.suspended else "ready"
                queues.append(
                    {
                        "name": queue.name,
                        "nexthop": queue.nexthop,
                        "window": window.window,
                        "busy": len(queue.busy),
                        "todo": len(queue.todo),
                        "state": state,
                        "reason": " ".join(queue.dsn) if queue.dsn else None,
                    }
                )
            transports.append(
                {
                    "name": transport.name,
                    "dead": transport.dead,
                    "busy": transport.busy,
                    "reason": " ".join(transport.dsn) if transport.dsn else None,
                    "queues": queues,
                }
            )
        stats = self.stats
        return {
            "uptime": round(self.clock.now() - self._started_at, 3),
            "messages_in_core": self.scheduler.message_count,
            "recipients_in_core": self.scheduler.rcpt_count,
            "messages_waiting": len(self._incoming) + len(self._deferred),
            "stats": {name: getattr(stats, name) for name in stats.__slots__},
            "transports": transports,
        }

    async def operate(self, op: str, queue_ids: Sequence[str] | None) -> dict[str, str]:
        """hold / release / delete / requeue, safely beside running deliveries.

        A message in core is marked: no new delivery of it starts, deliveries in
        flight finish, and the operation is applied when its pass ends
        ("pending"). Other messages are moved or removed here, by the engine, so
        the spool never has two writers.
        """
        if op not in _OPS:
            raise ValueError(f"unknown operation {op!r}")
        if queue_ids is None:
            sources = {
                "release": ("hold",),
                "hold": ("incoming", "deferred"),
            }.get(op, ("incoming", "deferred", "hold"))
            listed = await self.io.submit(
                lambda: [q for src in sources for q in self.spool.list_ids(src)]
            )
            in_core = [] if op == "release" else list(self._core_ids())
            queue_ids = sorted(set(listed) | set(in_core))
        results: dict[str, str] = {}
        for queue_id in queue_ids:
            results[queue_id] = await self._operate_one(op, queue_id)
        self._kick.set()
        return results

    def _core_ids(self) -> list[str]:
        return [q for q in self._known if self.scheduler.find_message(q) is not None]

    async def _operate_one(self, op: str, queue_id: str) -> str:
        message = self.scheduler.find_message(queue_id)
        if message is not None:
            if op == "release":
                return "not found"  # an active message is not on hold
            _active(message).pending_op = op
            self._kick.set()
            return "pending"
        if queue_id in self._known:
            waiting = self._dequeue_waiting(queue_id)
            if not waiting:  # being loaded right now: apply once it is in core
                if op == "release":
                    return "not found"
                self._pending_ops[queue_id] = op
                return "pending"
        now = self.clock.now()

        def work() -> str:
            for src in ("hold",) if op == "release" else ("incoming", "deferred", "hold"):
                if self.spool.path(src, queue_id).is_file():
                    if op == "hold" and src == "hold":
                        return "ok"
                    return self._apply_op_files(op, queue_id, src, now)
            return "not found"

        try:
            action = await self.io.submit(work)
        except (OSError, SpoolError) as exc:
            self.log.error("operation failed", queue_id=queue_id, op=op, error=str(exc))
            return f"error: {exc}"
        if action == "not found":
            return action
        self._op_done(queue_id, action)
        return "ok"

    def _dequeue_waiting(self, queue_id: str) -> bool:
        for waiting in (self._incoming, self._deferred):
            if queue_id in waiting:
                waiting.remove(queue_id)
                self._known.discard(queue_id)
                return True
        return False

    def _apply_op_files(self, op: str, queue_id: str, src: str, now: float) -> str:
        """The file side of an operation (worker thread); returns the action for the log."""
        spool = self.spool
        if op == "hold":
            spool.move(queue_id, src, "hold")
            return "held"
        if op == "delete":
            spool.remove(src, queue_id)
            spool.remove_reasons("defer", queue_id)
            spool.remove_reasons("bounce", queue_id)
            return "deleted"
        if op == "requeue":
            spool.move(queue_id, src, "incoming", mtime=now)
            return "requeued"
        spool.move(queue_id, src, "deferred", mtime=now)  # release
        return "released"

    def _op_done(self, queue_id: str, action: str) -> None:
        self.log.info(_OP_LOG[action], queue_id=queue_id)
        if action == "requeued":
            self.notify_incoming(queue_id)
        elif action == "released":
            self._enqueue_deferred(queue_id)

    # ------------------------------------------------------------------ reload

    def reload(
        self,
        *,
        settings: EngineSettings,
        scheduler_params: SchedulerParams,
        transport_params: Callable[[str], TransportParams],
        resolver: Resolver,
        agents: Mapping[str, Agent],
    ) -> None:
        """Apply a new configuration without dropping in-core mail (SIGHUP).

        Live destinations keep their state and take the new limits; new
        deliveries use the new agents; the old agents are closed once the
        deliveries that are using them finish.
        """
        self.settings = settings
        self.resolver = resolver
        self.transport_params = transport_params
        self.scheduler.update_params(scheduler_params, transport_params)
        old_agents = list(self.agents.values())
        self.agents = dict(agents)
        in_flight = set(self._deliveries)
        self._spawn(self._close_agents_after(old_agents, in_flight))
        self.log.info("configuration reloaded")
        self._kick.set()

    async def _close_agents_after(
        self, agents: list[Agent], deliveries: set[asyncio.Task[Any]]
    ) -> None:
        if deliveries:
            await asyncio.gather(*deliveries, return_exceptions=True)
        for agent in agents:
            try:
                await agent.close()
            except Exception as exc:  # an old agent failing to close must not stop the daemon
                self.log.warning("agent close failed", error=repr(exc))


_OPS = frozenset({"hold", "release", "delete", "requeue"})
_OP_LOG = {
    "held": "held by the operator",
    "released": "released from hold",
    "deleted": "removed by the operator",
    "requeued": "requeued",
}


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
        tuple(sorted(r.recipient.notify)),
    )


def _wanted(records: Sequence[ReasonRecord], kind: NoticeKind) -> list[ReasonRecord]:
    """The records whose recipient wants a ``kind`` notice (DSN NOTIFY, RFC 3461 §4.1)."""
    return [
        r
        for r in records
        if wants_notice(Recipient(r.address, 0, r.orcpt, frozenset(r.notify)), kind)
    ]


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
