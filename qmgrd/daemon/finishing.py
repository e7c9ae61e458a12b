"""Finishing: what happens to a message when its pass ends (delete, defer, expire, notices).

Contract (Postfix's ``qmgr_message_free`` path, ``qmgr_active_done`` and notes §9)
-----------------------------------------------------------------------------------
``finish(record)`` runs once the scheduler reports the message done (every
entry completed and recorded); ``retired(record)`` instead when the last
delivery's file job removed the file already (``qmgrd.daemon.outcomes``: step 5's
removal was all there was to do), which only reports it (``removed``). In order:

1. defer reasons still pending go to ``defer/``;
2. a file found unreadable mid-pass goes to ``corrupt/``; a message the
   operator marked (hold, delete, requeue) is settled as the operator asked
   (``qmgrd.ops.spoolops.settle_in_core``) and nothing else happens;
3. a message whose reading failed for an unexpected reason gets a defer
   reason for every remaining recipient (``4.3.0``, shown by ``mailq``);
4. reasons in ``bounce/`` are returned to the sender in one failure notice;
5. then the file is removed (nothing deferred), returned and removed
   (expired: ``maximal_queue_lifetime``, ``bounce_queue_lifetime`` for
   notices, or the forced-expire mark of ``qmgrd expire``: every recipient
   left gets Postfix's ``4.7.0 message is administratively expired``), or
   moved to ``deferred/`` with its next-attempt time as mtime,
   after a delay notice when ``delay_warning_time`` has come.

Log lines, in Postfix's order: the recipients' outcome lines, then for an
expired message Postfix's ``ID: from=<s>, status=expired, returned to sender``
(``force-expired`` for ``qmgrd expire``), then ``ID: sender non-delivery
notification: NOTICE_ID``, and ``ID: removed`` last. An expired recipient
keeps its deferral in the notice (``Action: failed`` with the original 4.x.x
``Status``, as Postfix's bounce daemon writes it) and in its log line
(``dsn=4.x.x``, ``delay=``, ``delays=``).

Notices are composed between two file jobs by ``qmgrd.daemon.notices``
(bounded in time, off the spool's workers, never failing). The file jobs are
all-or-nothing per step: a move or unlink either happened or not.

A finish that fails leaves the file in ``active/`` and the message in RETRY:
after a disk error (``OSError``, ``SpoolError``) the finish runs again after
``retry_delay`` (with a rescan of ``incoming/`` for a notice it may have
committed already); after any other exception, with backoff (``retry_delay``
doubled per failure), and from the third failure on the message is simply
moved to ``deferred/`` with a ``4.3.0`` reason, so no message stays in
``active/`` for ever because of a bug in one step. ``InvariantError`` is never
caught here: it stops the daemon.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime

from qmgrd.core.backoff import delay_warning_due, is_expired, next_attempt
from qmgrd.daemon.context import EngineContext
from qmgrd.daemon.finishreasons import (
    INTERNAL_DSN,
    expire_reasons,
    internal_reasons,
    notice_envelope,
    wanting_notice,
)
from qmgrd.daemon.notices import NoticeComposer, NoticeKind
from qmgrd.daemon.outcomes import delays, fmt_delay
from qmgrd.daemon.table import ActiveMessage, MessageState, Tracked
from qmgrd.errors import InvariantError, SpoolError
from qmgrd.ops.operation import Operation
from qmgrd.ops.spoolops import settle_in_core
from qmgrd.spool import (
    WARNED,
    ReasonRecord,
    rewrite_warn_time,
)
from qmgrd.spool.recycle import retire

__all__ = ["INTERNAL_DSN", "FinishAction", "Finisher"]

SAFE_AFTER = 3  # failed finishes (not disk errors) before the message is simply deferred
_MAX_BACKOFF_STEPS = 6


class FinishAction(enum.Enum):
    """What the end of a pass did with the message's file."""

    REMOVED = "removed"  # every recipient done
    DEFERRED = "deferred"  # moved to deferred/ with its next-attempt time
    EXPIRED = "expired"  # returned to the sender and removed
    CORRUPT = "corrupt"  # moved to corrupt/
    OPERATOR = "operator"  # settled as the operator asked (hold, delete, requeue)


@dataclass(slots=True)
class _Plan:
    """What the first file job found; notices to compose; what to do after."""

    action: FinishAction
    notices: list[tuple[NoticeKind, list[ReasonRecord]]] = field(default_factory=list)
    expired: tuple[ReasonRecord, ...] = ()
    detail: str = ""
    warn: bool = False  # rewrite the W record: the delay notice was due
    next_attempt: float = 0.0


# The plan ``retired`` reports (one per message, most messages): ``_report`` only reads it.
_RETIRED = _Plan(FinishAction.REMOVED)


class Finisher:
    """Ends a message's pass (see the module doc)."""

    def __init__(
        self,
        ctx: EngineContext,
        composer: NoticeComposer,
        *,
        notify_incoming: Callable[[str], None],
        rescan_incoming: Callable[[float], None],
        op_done: Callable[[str, Operation], None],
    ) -> None:
        """Callbacks: a notice was committed; rescan incoming/ at a time; an op was applied."""
        self.ctx = ctx
        self.composer = composer
        self.notify_incoming = notify_incoming
        self.rescan_incoming = rescan_incoming
        self.op_done = op_done

    async def finish(self, record: Tracked) -> None:
        """Finish ``record``'s pass (FINISHING), or schedule a retry (RETRY)."""
        ctx = self.ctx
        msg = record.active
        if msg is None or record.state is not MessageState.FINISHING:
            raise InvariantError(f"{record.queue_id}: finish while {record.state.value}")
        now = ctx.clock.now()
        try:
            if record.failures >= SAFE_AFTER and record.op is None:
                when = await ctx.io.submit(lambda: self._safe_defer(msg, now))
                self._report(record, _Plan(FinishAction.DEFERRED, next_attempt=when), [], now)
                return
            # One thread hop for the common finish; two when notices are composed between.
            plan, ids = await ctx.io.submit(lambda: self._prepare_and_complete(record, msg, now))
            if ids is None:
                notices = [
                    (kind, await self.composer.compose(msg, records, kind, now))
                    for kind, records in plan.notices
                ]
                ids = await ctx.io.submit(lambda: self._complete(msg, plan, notices, now))
        except InvariantError:
            raise
        except Exception as exc:
            self._failed(record, exc, now)
            return
        self._report(record, plan, ids, now)

    def retired(self, record: Tracked) -> None:
        """Report ``record`` removed: its last delivery's file job removed the file already
        (``qmgrd.daemon.outcomes``, the finish's only step for such a message)."""
        msg = record.active
        if msg is None or not msg.retired or record.state is not MessageState.FINISHING:
            raise InvariantError(f"{record.queue_id}: reported retired while {record.state.value}")
        self._report(record, _RETIRED, [], self.ctx.clock.now())

    # ------------------------------------------------------------------ file jobs

    def _prepare_and_complete(
        self, record: Tracked, msg: ActiveMessage, now: float
    ) -> tuple[_Plan, list[tuple[NoticeKind, str]] | None]:
        """Worker thread: ``_prepare``, then ``_complete`` unless notices are to be composed
        (None: the caller composes them on the loop and completes in a second job)."""
        plan = self._prepare(record, msg, now)
        if plan.notices:
            return plan, None
        return plan, self._complete(msg, plan, [], now)

    def _prepare(self, record: Tracked, msg: ActiveMessage, now: float) -> _Plan:
        """Worker thread: steps 1-4 and the decision of step 5."""
        spool, qid, qf = self.ctx.spool, msg.queue_id, msg.qf
        if msg.pending_defer:
            spool.append_reasons("defer", qid, msg.pending_defer)
            msg.pending_defer = []
        if msg.corrupt is not None:
            spool.quarantine("active", qid, msg.corrupt)
            return _Plan(FinishAction.CORRUPT, detail=msg.corrupt)
        if record.op is not None:
            settle_in_core(spool, record.op, qid, now)
            return _Plan(FinishAction.OPERATOR)
        if msg.problem is not None:
            reasons = internal_reasons(msg, msg.problem, now)
            if reasons:
                spool.append_reasons("defer", qid, reasons)
            msg.problem = None
            msg.deferred = True
        if msg.forced_expire:
            reasons = expire_reasons(spool, msg, now)
            if reasons:
                spool.append_reasons("defer", qid, reasons)
            msg.deferred = msg.deferred or bool(reasons)
        plan = _Plan(FinishAction.REMOVED)
        if msg.bounced:
            records = spool.read_reasons("bounce", qid)
            if records and qf.sender:
                plan.notices.append(("failure", records))
        if not msg.deferred:
            return plan
        s = self.ctx.settings
        if msg.forced_expire or is_expired(
            now,
            qf.arrival_time,
            null_sender=not qf.sender,
            maximal_queue_lifetime=s.maximal_queue_lifetime,
            bounce_queue_lifetime=s.bounce_queue_lifetime,
        ):
            plan.action = FinishAction.EXPIRED
            # Postfix returns the defer log as it is: the 4.x.x status and its reason,
            # with Action: failed in the notice (bounce_recipient_dsn).
            plan.expired = tuple(spool.read_reasons("defer", qid))
            wanted = wanting_notice(plan.expired, "failure")
            if wanted and qf.sender:
                plan.notices.append(("failure", wanted))
            return plan
        plan.action = FinishAction.DEFERRED
        plan.next_attempt = next_attempt(
            now, qf.arrival_time, s.minimal_backoff_time, s.maximal_backoff_time
        )
        if (
            qf.sender
            and qf.warn_offset is not None
            and qf.warn_time is not None
            and qf.warn_time != WARNED
            and delay_warning_due(now, float(qf.warn_time))
        ):
            records = wanting_notice(spool.read_reasons("defer", qid), "delay")
            if records:
                plan.notices.append(("delay", records))
            plan.warn = True
        return plan

    def _transport_of(self, address: str, sender: str) -> str:
        """The transport an expired recipient was routed to (a metrics label is never empty)."""
        try:
            return self.ctx.resolver.resolve(address, sender=sender).transport or "none"
        except InvariantError:
            raise
        except Exception:  # an address the resolver refuses: still a labelled series
            return "none"

    def _complete(
        self, msg: ActiveMessage, plan: _Plan, notices: list[tuple[NoticeKind, bytes]], now: float
    ) -> list[tuple[NoticeKind, str]]:
        """Worker thread: commit the notices, then remove, expire or defer the file."""
        spool, qid, qf = self.ctx.spool, msg.queue_id, msg.qf
        if plan.action in (FinishAction.CORRUPT, FinishAction.OPERATOR):
            return []
        ids = [(kind, spool.commit(notice_envelope(qf.sender, body, now), body))
               for kind, body in notices]
        if msg.bounced:
            msg.bounced = False  # a retry of this finish must not send the notice again
            spool.remove_reasons("bounce", qid)
        if plan.action in (FinishAction.REMOVED, FinishAction.EXPIRED):
            retire(str(spool.root), "active", qid, qf.content_offset + qf.content_size)
            if msg.deferred:  # else this pass wrote no defer log (the load removed the old one)
                spool.remove_reasons("defer", qid)
            return ids
        if plan.warn and qf.warn_offset is not None:
            rewrite_warn_time(msg.path, qf.warn_offset, WARNED)
        spool.move(qid, "active", "deferred", mtime=plan.next_attempt)
        return ids

    def _safe_defer(self, msg: ActiveMessage, now: float) -> float:
        """Worker thread: after repeated failures, just defer the file (mailq shows why)."""
        spool, qid, qf = self.ctx.spool, msg.queue_id, msg.qf
        if msg.pending_defer:
            spool.append_reasons("defer", qid, msg.pending_defer)
            msg.pending_defer = []
        reasons = internal_reasons(
            msg, "internal error: cannot finish the message (see the log)", now
        )
        if reasons:
            spool.append_reasons("defer", qid, reasons)
        s = self.ctx.settings
        when = next_attempt(now, qf.arrival_time, s.minimal_backoff_time, s.maximal_backoff_time)
        spool.move(qid, "active", "deferred", mtime=when)
        return when

    # ------------------------------------------------------------------ results

    def _failed(self, record: Tracked, exc: Exception, now: float) -> None:
        """The file stays in active/; retry later (see the module doc)."""
        ctx = self.ctx
        if isinstance(exc, (OSError, SpoolError)):
            retry = now + ctx.retry_delay
            # A notice it may have enqueued already is found by the rescan of incoming/.
            self.rescan_incoming(retry)
        else:
            record.failures += 1
            retry = now + ctx.retry_delay * 2 ** min(record.failures - 1, _MAX_BACKOFF_STEPS)
        ctx.log.error(
            "cannot finish message; it stays in the active queue",
            queue_id=record.queue_id,
            error=str(exc) or repr(exc),
            retry=datetime.fromtimestamp(retry, UTC).isoformat(),
        )
        record.retry_at = retry
        ctx.table.move(record, MessageState.RETRY)
        ctx.kick()

    def _report(
        self, record: Tracked, plan: _Plan, notices: list[tuple[NoticeKind, str]], now: float
    ) -> None:
        ctx = self.ctx
        msg = record.active
        assert msg is not None
        qid = msg.queue_id
        ctx.table.done(record)
        for _kind, notice_id in notices:
            self.notify_incoming(notice_id)
        if record.op is not None:
            self.op_done(qid, record.op)
        elif plan.action is FinishAction.REMOVED:
            ctx.stats.messages_removed += 1
            if notices:
                self._log_notices(qid, notices)
            ctx.log.info("removed", queue_id=qid)
        elif plan.action is FinishAction.DEFERRED:
            ctx.stats.messages_deferred += 1
            self._log_notices(qid, notices)
            when = datetime.fromtimestamp(plan.next_attempt, UTC).isoformat()
            ctx.log.info("deferred", queue_id=qid, next_attempt=when)
        elif plan.action is FinishAction.EXPIRED:
            self._log_expired(msg, plan, now)
            self._log_notices(qid, notices)
            ctx.log.info("removed", queue_id=qid)
            ctx.stats.messages_removed += 1
        elif plan.action is FinishAction.CORRUPT:
            ctx.log.warning("corrupt queue file", queue_id=qid, reason=plan.detail)
        ctx.kick()

    def _log_expired(self, msg: ActiveMessage, plan: _Plan, now: float) -> None:
        """Expiry lines: one per recipient (qmgrd's), then Postfix's per-message line.

        Each recipient line keeps the recipient's deferral: its original 4.x.x
        ``dsn=`` and reason, with ``delay=`` and ``delays=`` like every
        recipient line. Postfix's qmgr logs only the message line
        (``ID: from=<sender>, status=expired, returned to sender``;
        ``force-expired`` for ``postsuper -e``/``qmgrd expire``).
        """
        ctx, qid, qf = self.ctx, msg.queue_id, msg.qf
        for r in plan.expired:
            if ctx.metrics is not None:
                ctx.metrics.record_delivery(
                    self._transport_of(r.address, qf.sender), "expired", r.dsn,
                    now - qf.arrival_time,
                )
            ctx.smtp_log.info(
                "expired",
                queue_id=qid,
                to=f"<{r.address}>",
                relay=r.relay,
                delay=fmt_delay(now - qf.arrival_time),
                delays=delays(msg, now, now, 0.0, 0.0),
                dsn=r.dsn,
                status="expired, returned to sender",
                reply=r.reason,
            )
        status = "force-expired" if msg.forced_expire else "expired"
        ctx.log.info(
            "returned",
            queue_id=qid,
            from_=f"<{qf.sender}>",
            status=f"{status}, returned to sender",
        )

    def _log_notices(self, qid: str, notices: list[tuple[NoticeKind, str]]) -> None:
        """Postfix's shape: "ID: sender non-delivery notification: NOTICE_ID" (before removed)."""
        for kind, notice_id in notices:
            what = "non-delivery" if kind == "failure" else "delay"
            if kind == "failure":
                self.ctx.stats.messages_bounced += 1
            self.ctx.log.info(f"sender {what} notification: {notice_id}", queue_id=qid)
