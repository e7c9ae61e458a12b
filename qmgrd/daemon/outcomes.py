"""Recording outcomes: done marks, defer and bounce records, one log line per recipient.

Contract (Postfix's ``qmgr_defer`` and ``qmgr_bounce`` plus the agents' log lines)
----------------------------------------------------------------------------------
- ``record(msg, result, now)`` makes one delivery's outcome durable in one
  file job: bounce reasons (for recipients that want a failure notice) are
  appended to ``bounce/`` **before** the recipients are marked done, so a
  crash between the two can only repeat a delivery, never lose a bounce;
  deferred recipients' reasons collect in ``msg.pending_defer`` and go to
  ``defer/`` with the same job. It never raises for a per-message problem: if
  the job fails (disk full, anything else), the recipients stay R, the message
  is flagged deferred and the reasons are kept for the finisher.
- ``defer_unattempted(msg, recipients, status, reason, now)``: recipients the
  scheduler deferred without an attempt (their destination died) get a defer
  reason and their log line.
- ``log_results(msg, entry, result, started, now)``: the one ``status=`` line
  per recipient (Postfix's shape: ``to=<...>, relay=..., delay=...,
  delays=a/b/c/d, dsn=..., status=... (reply)``), counters and metrics.

The last delivery: when the scheduler says this delivery's ``entry_done``
finishes the message (``Scheduler.completes_message``) and its finish would
only remove the file (every recipient done, no reason logged in this pass, no
notice due, no operator's operation, no mark), the record's file job removes
the file (``recycle.retire``, the finisher's step) instead of marking the
recipients done in a file about to go: one file job and five system calls less
per message. The table record moves to FINISHING at once (an operator's
operation waits for the finish, as for any finishing message), and the
finisher only reports (``removed``). If the removal fails, the job marks the
recipients as usual and the finisher runs its own steps (and reports the disk
error as before).

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

from collections.abc import Sequence

from qmgrd.core.entry import Entry
from qmgrd.core.message import ResolvedRecipient
from qmgrd.daemon.context import EngineContext
from qmgrd.daemon.table import ActiveMessage, MessageState, Tracked, record_of
from qmgrd.delivery.agent import DeliveryResult, Outcome, RecipientResult
from qmgrd.delivery.dsn import wants_notice
from qmgrd.errors import InvariantError, SpoolError
from qmgrd.spool import ReasonRecord
from qmgrd.spool.records import mark_done
from qmgrd.spool.recycle import retire

__all__ = ["Recorder", "delays", "fmt_delay", "reason_record"]


class Recorder:
    """Makes delivery outcomes durable and logs them (see the module doc)."""

    def __init__(self, ctx: EngineContext) -> None:
        """``ctx``: the engine's shared state."""
        self.ctx = ctx

    async def record(
        self,
        msg: ActiveMessage,
        result: DeliveryResult,
        now: float,
        last: Tracked | None = None,
    ) -> None:
        """Bounce reasons, then done marks, then defer reasons (one file job); ``last``: the
        table record when this delivery's ``entry_done`` finishes the message (module doc,
        "The last delivery")."""
        bounce: list[ReasonRecord] = []
        done: list[int] = []
        for r in result.recipients:
            if r.outcome is Outcome.DEFERRED:
                msg.deferred = True
                msg.pending_defer.append(reason_record(r, "delayed", now))
                continue
            done.append(r.recipient.offset)
            if r.outcome is Outcome.BOUNCED and wants_notice(r.recipient, "failure"):
                bounce.append(reason_record(r, "failed", now))
        defer, msg.pending_defer = msg.pending_defer, []
        if bounce:
            msg.bounced = True
        spool = self.ctx.spool
        retiring = last is not None and _retires(last, msg, bounce, defer)
        if retiring:
            assert last is not None
            self.ctx.table.move(last, MessageState.FINISHING)  # operators wait for the finish
            msg.early = True
            size = msg.qf.content_offset + msg.qf.content_size
            root = str(spool.root)

        def work() -> None:
            if retiring:
                try:  # the finish's one step, instead of marks on a file about to go
                    retire(root, "active", msg.queue_id, size)
                    msg.retired = True
                    return
                except (OSError, SpoolError):
                    pass  # marks as usual; the finisher's own retire reports the disk error
            if bounce:
                spool.append_reasons("bounce", msg.queue_id, bounce)
            if done:
                # No fsync, as Postfix's deliver_completed(): a mark lost with the page
                # cache (power loss, kernel crash) means a second delivery, never a loss.
                mark_done(msg.path, done, fsync=False)
            if defer:
                spool.append_reasons("defer", msg.queue_id, defer)

        try:
            await self.ctx.io.submit(work)
        except InvariantError:
            raise
        except Exception as exc:
            # Nothing is lost: unmarked recipients stay R and the message is retried.
            msg.deferred = True
            msg.pending_defer.extend(defer)
            self.ctx.log.error(
                "cannot record delivery results; recipients stay queued",
                queue_id=msg.queue_id,
                error=str(exc) or repr(exc),
            )

    def defer_unattempted(
        self,
        msg: ActiveMessage,
        recipients: Sequence[ResolvedRecipient],
        status: str,
        reason: str,
        now: float,
    ) -> None:
        """Recipients deferred without an attempt (dead destination): reasons and log lines."""
        ctx = self.ctx
        msg.deferred = True
        for rcpt in recipients:
            record = record_of(rcpt)
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
            ctx.stats.recipients_deferred += 1
            if ctx.metrics is not None:
                ctx.metrics.record_delivery(
                    rcpt.transport, "deferred", status, now - msg.qf.arrival_time
                )
            ctx.smtp_log.info(
                "deferred",
                queue_id=msg.queue_id,
                to=f"<{rcpt.address}>",
                relay="none",
                delay=fmt_delay(now - msg.qf.arrival_time),
                delays=delays(msg, now, now, 0.0, 0.0),
                dsn=status,
                status="deferred",
                reply=reason,
            )

    def log_results(
        self,
        msg: ActiveMessage,
        entry: Entry,
        result: DeliveryResult,
        started: float,
        now: float,
    ) -> None:
        """One log line per recipient outcome, the counters and the metrics."""
        ctx = self.ctx
        since_arrival = now - msg.qf.arrival_time
        delay = fmt_delay(since_arrival)
        text = delays(msg, started, now, result.conn_setup_time, result.transmission_time)
        transport = entry.queue.transport.name  # entry.transport, without the property call
        queue_id = msg.queue_id
        # A LineLog (EngineContext): info(status, queue_id=, to=, relay=, transport=, delay=,
        # delays=, dsn=, status=, reply=) without the keywords (qmgrd.log.lines)
        outcome = ctx.smtp_log.outcome
        # (status, dsn) -> recipients: the counters and metrics take a delivery's outcomes
        # in one call per kind (most deliveries have one: every recipient sent, 2.0.0)
        kinds: dict[tuple[str, str], int] = {}
        for r in result.recipients:
            status = r.outcome.value
            dsn = r.dsn
            kind = (status, dsn)
            kinds[kind] = kinds.get(kind, 0) + 1
            to = f"<{r.recipient.address}>"
            outcome(status, queue_id, to, r.relay, transport, delay, text, dsn, status, r.reply)
        stats = ctx.stats
        for (status, _dsn), count in kinds.items():
            if status == "sent":
                stats.recipients_sent += count
            elif status == "bounced":
                stats.recipients_bounced += count
            else:
                stats.recipients_deferred += count
        metrics = ctx.metrics
        if metrics is not None:
            metrics.record_attempt(transport, now - started)
            for (status, dsn), count in kinds.items():
                metrics.record_delivery(transport, status, dsn, since_arrival, count)


def _retires(
    record: Tracked, msg: ActiveMessage, bounce: list[ReasonRecord], defer: list[ReasonRecord]
) -> bool:
    """Whether the finish of ``msg`` after this delivery would only remove its file: every
    recipient done, nothing to log to ``defer/`` or ``bounce/``, no notice, no operator's
    operation, no mark (``Finisher._prepare``'s REMOVED case with nothing else to do)."""
    return (
        record.op is None
        and record.state is MessageState.IN_CORE
        and not (bounce or defer or msg.pending_defer)
        and not (msg.deferred or msg.bounced or msg.forced_expire)
        and msg.corrupt is None
        and msg.problem is None
    )


def reason_record(r: RecipientResult, action: str, now: float) -> ReasonRecord:
    """The defer/bounce log record of one recipient result."""
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


_ZERO_BELOW = 0.005  # a delay that rounds to 0.00 is written "0"


def fmt_delay(seconds: float) -> str:
    """Postfix's delay formatting: two significant decimals, no trailing zeros."""
    if not seconds >= _ZERO_BELOW:  # (most set-up and transmission times of a reuse)
        return "0"
    if seconds >= 10:
        return f"{seconds:.0f}"
    if seconds >= 0.1:
        return f"{seconds:.1f}".rstrip("0").rstrip(".") or "0"
    text = f"{seconds:.2f}".rstrip("0").rstrip(".")
    return text or "0"


def delays(
    msg: ActiveMessage, started: float, now: float, conn_setup: float, transmission: float
) -> str:
    """``delays=a/b/c/d``: before active, in active, connection set-up, transmission."""
    before = msg.queued_time - msg.qf.arrival_time
    in_active = started - msg.queued_time
    # fmt_delay's "0" without the call for the times that round to 0.00 (most set-up and
    # transmission times of a reused session; NaN too, as there)
    return (
        f"{fmt_delay(before) if before >= _ZERO_BELOW else '0'}/"
        f"{fmt_delay(in_active) if in_active >= _ZERO_BELOW else '0'}/"
        f"{fmt_delay(conn_setup) if conn_setup >= _ZERO_BELOW else '0'}/"
        f"{fmt_delay(transmission) if transmission >= _ZERO_BELOW else '0'}"
    )
