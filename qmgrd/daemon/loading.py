"""Loading: from ``incoming/`` and ``deferred/`` into core.

Contract (Postfix's ``qmgr_active_feed`` and ``qmgr_message_alloc``)
---------------------------------------------------------------------
- ``scan_incoming()`` / ``scan_deferred(now, flush=...)`` list a queue (worker
  thread) and put every id the table does not know in WAITING. A failed scan
  of ``incoming/`` is retried after ``retry_delay`` (``rescan_due``);
  ``deferred/`` is scanned every ``queue_run_delay`` anyway.
  With a fairness key, each unknown file's flow is read from its envelope
  head first (``qmgrd.daemon.admitting``; the incoming scan does that in a
  task of its own, so start-up does not wait for it); ``enqueue`` queues one
  id (its flow from the listener's facts, or read).
- ``feed(now)`` moves WAITING messages to LOADING while the active queue has
  room (``qmgr_message_active_limit``) and starts one load each, at most
  ``FEED_BATCH`` per pass (then it kicks the engine for another pass: a scan
  that finds thousands of files never starts them all in one turn of the event
  loop, whose lag every SMTP reply and control request would wait; Postfix's
  qmgr also feeds a file or two per pass of its event loop); which one is
  fair admission's choice (``qmgrd.core.admission``: with fairness ``none``,
  Postfix's order).
- A load (no task of its own: its file work in a worker thread, then its
  future's callback; a bug there reaches the supervisor as a task's would;
  shutdown waits for loads in flight, ``settle()``) moves the file to
  ``active/``, forgets the defer log of the last pass (notes §9) and looks for
  bounce reasons (none for a message a listener has just committed: ``enqueue``
  with its flow facts; its id is new), parses the envelope and registers the
  message with the scheduler (IN_CORE) with its fairness flow
  (``qmgrd.daemon.flows``). A file that cannot be parsed (or whose parse fails
  in any way) goes to ``corrupt/``; one that vanished (an operator took it) is
  forgotten; a disk error leaves it where it was, to be loaded again. A system
  error while opening the moved file (``QueueFileIOError``: EMFILE, EIO, EACCES,
  ...) says nothing about the file: it is moved back where it came from and
  loaded again later (logged), never quarantined. The load's job opens and reads
  the file once (``qmgrd.spool.loadread``): the envelope, the forced-expire
  mark, the first recipients (as many as a read request may ask: the message's
  first read request is answered from them without a thread hop of its own, with
  the same records, resume offset and errors a read would give) and, for a small
  message, the content, which its deliveries then send without reading the file
  (``MessageTable.hold_content``, bounded in bytes).
- ``serve_reads()`` answers the scheduler's read requests: the loader's
  ``reader`` does (``qmgrd.daemon.reading``), first from the load's read-ahead.

Every failure is logged with the queue id; none leaves a task dead or a
message unaccounted for in the table. ``InvariantError`` is never caught here.
"""

from __future__ import annotations

import asyncio
from functools import partial
from pathlib import Path

from qmgrd.core.flow import FLOW_NONE, Flow
from qmgrd.daemon.admitting import HEAD_CHUNK, flow_or_none, read_flow_facts
from qmgrd.daemon.context import EngineContext
from qmgrd.daemon.flows import flow_of, transport_flows
from qmgrd.daemon.prefetch import PREFETCH
from qmgrd.daemon.reading import RecipientReader
from qmgrd.daemon.table import ActiveMessage, MessageState, Tracked
from qmgrd.errors import InvariantError, SpoolError
from qmgrd.listener.flowgate import FlowFacts
from qmgrd.spool import QueueFileIOError, is_forced_expire
from qmgrd.spool.loadread import LoadedFile, load_queue_file

__all__ = ["FEED_BATCH", "PREFETCH", "Loader"]

FEED_BATCH = 64  # loads started per engine pass at most

_Loaded = tuple[Path, LoadedFile | SpoolError, bool] | None  # a load's file work: see load


async def _reraise(exc: BaseException) -> None:
    """A supervised task that fails with ``exc`` (a bug in a load's callback)."""
    raise exc


class Loader:
    """Scans, feeds the active queue, loads messages; serves recipient reads (``reader``)."""

    def __init__(self, ctx: EngineContext) -> None:
        """``ctx``: the engine's shared state."""
        self.ctx = ctx
        self.rescan_due = 0.0  # when incoming/ is scanned again after a failure; 0 = none
        self.deferred_scan_running = False
        self._fresh: set[str] = set()  # waiting ids a listener has just committed
        self._loads: set[asyncio.Future[_Loaded]] = set()  # file work of loads in flight
        self.reader = RecipientReader(ctx)
        # The engine's pass answers read requests through the loader (the reader's method
        # itself: no call in between).
        self.serve_reads = self.reader.serve_reads

    # ------------------------------------------------------------------ scans

    async def scan_incoming(self) -> None:
        """Put every unknown id in ``incoming/`` in WAITING."""
        ctx = self.ctx
        try:
            ids = await ctx.io.submit(lambda: ctx.spool.list_ids("incoming"))
        except (OSError, SpoolError) as exc:
            ctx.log.error("cannot scan the incoming queue", error=str(exc))
            self.rescan_due = ctx.clock.now() + ctx.retry_delay
            return
        if ctx.admit_flow is None:
            await self.enqueue_ids(ids, "incoming")  # no reads: all waiting at once
        else:  # envelope heads are read in chunks; start-up and loads need not wait for all
            ctx.spawn(self.enqueue_ids(ids, "incoming"))
        ctx.kick()

    async def scan_deferred(self, now: float, *, flush: bool) -> None:
        """Put every unknown id due in ``deferred/`` (all of them with ``flush``) in WAITING."""
        ctx = self.ctx
        try:
            if flush:
                ids = await ctx.io.submit(lambda: ctx.spool.list_ids("deferred"))
            else:
                ids = await ctx.io.submit(lambda: ctx.spool.due_ids("deferred", now))
        except (OSError, SpoolError) as exc:
            ctx.log.error("cannot scan the deferred queue", error=str(exc))
            ids = []
        try:
            await self.enqueue_ids(ids, "deferred")
        finally:
            self.deferred_scan_running = False

    # ------------------------------------------------------------------ waiting, by flow

    def enqueue(self, queue_id: str, source: str, facts: FlowFacts | None = None) -> None:
        """``queue_id`` waits in ``source`` under its flow: from ``facts`` when given, else
        from its envelope head (read in a worker thread); nothing read with fairness none."""
        ctx = self.ctx
        if queue_id not in ctx.table:
            if facts is not None:  # a listener's commit: a new queue id, no reason logs yet
                self._fresh.add(queue_id)
                if len(self._fresh) > 2 * len(ctx.table) + 64:  # ids that left unloaded
                    waiting = ctx.table.in_state(MessageState.WAITING)
                    self._fresh.intersection_update(r.queue_id for r in waiting)
            if ctx.admit_flow is None:
                ctx.table.create(queue_id, source)
            elif facts is not None:
                ctx.table.create(queue_id, source, flow=self._flow(queue_id, facts))
            else:
                ctx.spawn(self.enqueue_ids([queue_id], source))
        ctx.kick()

    async def enqueue_ids(self, ids: list[str], source: str) -> None:
        """Make the unknown ``ids`` of ``source`` wait, in order (module doc of admitting)."""
        ctx = self.ctx
        if ctx.admit_flow is None:
            for queue_id in ids:
                ctx.table.create(queue_id, source)
            return
        unknown = [queue_id for queue_id in ids if queue_id not in ctx.table]
        for start in range(0, len(unknown), HEAD_CHUNK):
            chunk = unknown[start : start + HEAD_CHUNK]
            heads = await ctx.io.submit(partial(read_flow_facts, ctx.spool, source, chunk))
            for queue_id, facts in heads:
                ctx.table.create(queue_id, source, flow=self._flow(queue_id, facts))
            ctx.kick()

    def _flow(self, queue_id: str, facts: FlowFacts | None) -> Flow:
        try:
            return flow_or_none(self.ctx.admit_flow, facts)
        except InvariantError:
            raise
        except Exception as exc:  # a weight table that fails: admitted, as flow "none"
            self.ctx.log.error("cannot compute the message's flow", queue_id=queue_id,
                               error=repr(exc))
            return FLOW_NONE

    def run_rescan(self, now: float) -> None:
        """Start the retry of a failed incoming scan when it is due."""
        if self.rescan_due and self.rescan_due <= now:
            self.rescan_due = 0.0
            self.ctx.spawn(self.scan_incoming())

    def request_rescan(self, when: float) -> None:
        """Scan ``incoming/`` again at ``when`` (unless an earlier rescan is pending)."""
        if not self.rescan_due:
            self.rescan_due = when

    # ------------------------------------------------------------------ feeding

    def feed(self, now: float) -> None:
        """Start loads while the active queue has room (see the module doc)."""
        ctx = self.ctx
        limit = ctx.settings.qmgr_message_active_limit
        table = ctx.table
        table.admission.wake(now)  # paced flows due now compete (no deadline left behind)
        scheduler = ctx.scheduler
        for _ in range(FEED_BATCH):
            active = scheduler.message_count + table.loading
            if ctx.stopping or active >= limit:
                return
            room = active + 1 < limit
            record = table.next_waiting(room, now)
            if record is None:
                return
            self.load(record, now)
        ctx.kick()  # more may wait: the next pass goes on, after the loop ran other work

    def load(self, record: Tracked, now: float) -> None:
        """Start moving ``record``'s file to ``active/`` and parsing it (worker thread); the
        future's callback hands it to the scheduler (no task per message: ``_loaded``)."""
        ctx = self.ctx
        spool, queue_id, src = ctx.spool, record.queue_id, record.source
        fresh = queue_id in self._fresh
        self._fresh.discard(queue_id)

        keep = ctx.table.content_room()  # the content itself, for a small message
        active = spool.queue_dir("active")

        def work() -> _Loaded:
            try:
                name = spool.rename(queue_id, src, "active")
            except SpoolError:
                if not spool.path(src, queue_id).exists():
                    return None  # deleted or moved by an operator meanwhile
                raise
            bounced = False
            try:
                # A new pass: the defer log describes only the current pass (notes §9).
                # A message a listener has just committed has had no pass (nothing to look at).
                if not fresh:
                    spool.remove_reasons("defer", queue_id)
                    bounced = bool(spool.read_reasons("bounce", queue_id))
            except SpoolError:
                spool.move(queue_id, "active", src)  # back where a retry finds it
                raise
            try:  # one open, one read: envelope, mode, first recipients, small content
                path = active / queue_id
                return path, load_queue_file(path, PREFETCH, keep, name), bounced
            except QueueFileIOError:
                spool.move(queue_id, "active", src)  # not the file's fault: load it again later
                raise
            except SpoolError as exc:
                return path, exc, bounced
            except Exception as exc:  # a parser bug on hostile bytes: quarantine, not a crash
                return path, SpoolError(f"cannot parse queue file: {exc!r}"), bounced

        future = ctx.io.submit(work)
        self._loads.add(future)
        future.add_done_callback(partial(self._loaded, record, now))

    def _loaded(self, record: Tracked, now: float, future: asyncio.Future[_Loaded]) -> None:
        """A load's file work ended: contained like a supervised task's (a bug escapes to
        the supervisor, which stops the daemon; cancellation is not a failure)."""
        self._loads.discard(future)
        if future.cancelled():
            return
        try:
            self._install(record, now, future)
        except Exception as exc:  # a bug: the supervisor's to report, as a task's would be
            self.ctx.spawn(_reraise(exc))
        self.ctx.kick()  # as a task's end would: the loop runs a pass

    async def settle(self) -> None:
        """Wait for loads in flight (their file work and their callbacks; shutdown)."""
        while self._loads:
            await asyncio.gather(*list(self._loads), return_exceptions=True)

    def _install(self, record: Tracked, now: float, future: asyncio.Future[_Loaded]) -> None:
        ctx = self.ctx
        queue_id, src = record.queue_id, record.source
        try:
            loaded = future.result()
        except InvariantError:
            raise
        except Exception as exc:  # disk trouble (or worse): the file stays where it was
            event = (
                "cannot open queue file, retried later"
                if isinstance(exc, QueueFileIOError)
                else "cannot move message to the active queue"
            )
            ctx.log.error(event, queue_id=queue_id, error=str(exc))
            ctx.table.done(record)
            if src == "incoming":
                # deferred/ is rescanned every queue_run_delay; incoming/ needs a retry.
                self.request_rescan(ctx.clock.now() + ctx.retry_delay)
            return
        if loaded is None:
            ctx.table.done(record)
            return
        path, got, bounced = loaded
        if isinstance(got, SpoolError):
            ctx.spawn(self._quarantine(record, str(got)))
            return
        qf = got.qf
        msg = ActiveMessage(
            queue_id,
            path,
            qf,
            queued_time=now,
            bounced=bounced,
            forced_expire=is_forced_expire(got.mode),
            prefetch=(qf.first_recipient_offset, got.recipients, got.next_offset),
        )
        record.active = msg
        ctx.table.hold_content(msg, got.content)
        ctx.table.move(record, MessageState.IN_CORE)
        ctx.scheduler.message_create(
            queue_id,
            queued_time=now,
            rcpt_unread=qf.rcpt_count,
            rcpt_offset=qf.first_recipient_offset,
            payload=msg,
            flow=flow_of(qf, ctx.fairness),
            transport_flows=transport_flows(qf, ctx.fairness),
        )
        ctx.stats.messages_loaded += 1
        if src == "incoming":
            ctx.incoming_moved()  # regulator: a token for the listeners (daemon.intakeflow)
        ctx.log.info(
            "queued",
            queue_id=queue_id,
            from_=f"<{qf.sender}>",
            size=qf.content_size,
            nrcpt=f"{qf.rcpt_count} (queue active)",
        )

    async def _quarantine(self, record: Tracked, reason: str) -> None:
        ctx = self.ctx
        queue_id = record.queue_id
        try:
            await ctx.io.submit(lambda: ctx.spool.quarantine("active", queue_id, reason))
        except (OSError, SpoolError) as exc:
            # It stays in active/: the next start recovers it and tries again.
            ctx.log.error(
                "cannot quarantine corrupt queue file", queue_id=queue_id, error=str(exc)
            )
        ctx.table.done(record)
