"""Reading: the scheduler's read requests, answered with resolved recipients.

Contract (Postfix's ``qmgr_message_realloc`` and ``qmgr_message_resolve``)
---------------------------------------------------------------------------
- ``serve_reads()`` answers the scheduler's read requests: a batch of
  recipients read from the queue file and resolved to (transport, nexthop,
  queue). A request the load's read-ahead covers (``qmgrd.daemon.prefetch``:
  most messages' first one) is answered in the engine's pass itself, with the
  same records, resume offset and errors a read would give; any other is read
  in a task of its own (``read``), the file work in a worker thread.
- A read the spool refuses makes the file corrupt; a system error on the read
  (``QueueFileIOError``) defers the message (``4.3.0``, retried); any other
  failure (a resolver bug, an address nothing expected) is the message's
  problem: its reading ends, and the finisher defers it with the reason.
- A message marked by ``qmgrd expire`` (the forced-expire mark, seen at load
  or set by the operator while in core) reads no recipients: its reading ends
  at once and the finisher returns it to the sender.

Every failure is logged with the queue id; none leaves a task dead or a
message unaccounted for. ``InvariantError`` is never caught here. Loading the
messages these requests are about is ``qmgrd.daemon.loading``'s.
"""

from __future__ import annotations

from qmgrd.core.message import ReadRequest, ResolvedRecipient
from qmgrd.core.resolve import queue_name
from qmgrd.daemon.context import EngineContext
from qmgrd.daemon.prefetch import _from_prefetch
from qmgrd.daemon.table import ActiveMessage, active_of
from qmgrd.errors import InvariantError, SpoolError
from qmgrd.spool import QueueFileIOError, RecipientRecord

__all__ = ["RecipientReader"]


class RecipientReader:
    """Answers the scheduler's read requests (see the module doc)."""

    def __init__(self, ctx: EngineContext) -> None:
        """``ctx``: the engine's shared state."""
        self.ctx = ctx

    def serve_reads(self) -> None:
        """Answer each pending scheduler read request: at once when the load's read-ahead
        covers it (most messages: no task, no thread hop), else in a task of its own."""
        for request in self.ctx.scheduler.pop_reads():
            msg = active_of(request.message)
            if msg.forced_expire or msg.prefetch is None:
                self.ctx.spawn(self.read(request))
                continue
            try:
                covered = _from_prefetch(msg, request)
            except Exception as exc:  # the read-ahead's own failure, reported as a read's
                self._read_failed(request, msg, exc)
                continue
            if covered is None:
                self.ctx.spawn(self.read(request))
            else:
                self._answer(request, msg, *covered)

    async def read(self, request: ReadRequest) -> None:
        """Read and resolve one batch of recipients (see the module doc)."""
        ctx = self.ctx
        msg = active_of(request.message)
        if msg.forced_expire:
            # ``qmgrd expire``: deliver nothing more; the finisher returns what is left.
            ctx.scheduler.recipients_add(request.message, [], 0, ctx.clock.now())
            return
        try:
            covered = _from_prefetch(msg, request)
            records, next_offset = covered if covered is not None else await ctx.io.submit(
                lambda: msg.qf.read_recipients(request.offset, request.limit)
            )
        except InvariantError:
            raise
        except Exception as exc:
            self._read_failed(request, msg, exc)
            return
        self._answer(request, msg, records, next_offset)

    def _read_failed(self, request: ReadRequest, msg: ActiveMessage, exc: Exception) -> None:
        """A recipient read failed (see the module doc for what each failure means)."""
        ctx = self.ctx
        if isinstance(exc, InvariantError):
            raise exc
        if isinstance(exc, QueueFileIOError):
            # The system failed, not the file: defer the message (4.3.0) and retry it later.
            self._problem(request, msg, f"cannot read queue file: {exc}", internal=False)
        elif isinstance(exc, (SpoolError, OSError)):
            msg.corrupt = str(exc)
            ctx.log.error("cannot read recipients", queue_id=msg.queue_id, error=str(exc))
            ctx.scheduler.recipients_add(request.message, [], 0, ctx.clock.now())
        else:
            self._problem(request, msg, f"cannot read recipients: {exc!r}")

    def _answer(
        self,
        request: ReadRequest,
        msg: ActiveMessage,
        records: list[RecipientRecord],
        next_offset: int,
    ) -> None:
        """Resolve the recipients read and hand them to the scheduler."""
        ctx = self.ctx
        try:
            sender = msg.qf.sender
            resolved = [self.resolve(record, sender) for record in records]
        except InvariantError:
            raise
        except Exception as exc:
            self._problem(request, msg, f"cannot resolve recipients: {exc!r}")
            return
        ctx.scheduler.recipients_add(request.message, resolved, next_offset, ctx.clock.now())

    def _problem(
        self, request: ReadRequest, msg: ActiveMessage, reason: str, *, internal: bool = True
    ) -> None:
        """End the message's reading; the finisher defers it with ``reason`` (prefixed with
        ``internal error:`` when a step failed unexpectedly, rather than the system)."""
        ctx = self.ctx
        msg.problem = f"internal error: {reason}" if internal else reason
        event = "message deferred after an internal error" if internal else (
            "message deferred after a system error")
        ctx.log.error(event, queue_id=msg.queue_id, error=reason)
        ctx.scheduler.recipients_add(request.message, [], 0, ctx.clock.now())

    def resolve(self, record: RecipientRecord, sender: str | None = None) -> ResolvedRecipient:
        """(transport, nexthop, queue) of one recipient, under the current configuration;
        ``sender`` (the message's, ``""`` for the null sender) selects a relayhost from
        ``sender_dependent_relayhost_maps``."""
        ctx = self.ctx
        resolved = ctx.resolver.resolve(record.address, sender=sender)
        params = ctx.transport_params(resolved.transport)
        name = queue_name(
            resolved,
            recipient_limit=params.destination_recipient_limit,
            recipient_delimiter=ctx.settings.recipient_delimiter,
        )
        return ResolvedRecipient(
            record.address, record.offset, resolved.transport, resolved.nexthop, name, record
        )
