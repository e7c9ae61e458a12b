"""Operator operations on the running daemon: hold, release, delete, requeue, expire, flush.

Contract (Postfix's postsuper and postqueue, done by the one spool writer)
--------------------------------------------------------------------------
``operate(op, queue_ids)`` answers one :class:`~qmgrd.ops.operation.OpResult`
per id (``None`` = ALL: every message in ``op.all_sources`` and, except for
release, every message the engine holds). By the state of the message in the
table:

- unknown, or WAITING (taken off the load queue): the file is moved or
  removed now (``qmgrd.ops.spoolops.operate_file``) -> ``ok``;
- LOADING or FINISHING: wait (bounded) until that file job is over, then
  look again: a message whose delivery just ended is held, deleted or
  requeued where its finish put it (a hold is never left unapplied);
- IN_CORE: the operation is made durable on disk first
  (``spoolops.mark_in_core``: a delete marks the remaining recipients done,
  a hold links the file into ``hold/``), then kept on the record: no new
  delivery of it starts and the finisher settles it when the deliveries in
  flight end -> ``pending``. A restart before that honours it;
- RETRY (its finish failed; nothing in flight): applied to the file in
  ``active/`` now -> ``ok``.

``expire`` (postsuper -e) never moves a file: it sets the forced-expire mark
(``spoolops.expire_file``). A waiting or queued message is marked where it is
(a deferred one is loaded now); the load sees the mark and the finisher
returns the message to the sender as if ``maximal_queue_lifetime`` had passed.
A message in core is marked on disk at once and flagged: its reading stops,
and when the deliveries in flight end, whatever is left is returned (``ok``).
A held message stays held (Postfix never delivers from ``hold/``).

``release`` only takes messages from ``hold/``: a message whose hold waits
for its delivery to end is not on hold yet (``not found``, as before). Every failure is answered
``error: TEXT`` and logged with the queue id.

``flush_destination(domain)`` (``postqueue -s``) and ``flush_message(id)``
(``postqueue -i``) put deferred messages in the load queue now.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

from qmgrd.daemon.context import EngineContext
from qmgrd.daemon.table import MessageState
from qmgrd.errors import InvariantError, SpoolError
from qmgrd.ops.operation import Operation, OpResult
from qmgrd.ops.spoolops import expire_file, mark_in_core, operate_file

__all__ = ["Operator"]

SETTLE_TIMEOUT = 20.0  # seconds an operation waits for a load or finish in progress
_LOOKS = 4  # times an operation looks at a message that keeps changing state


class Operator:
    """The engine side of ``qmgrd hold|release|delete|requeue|expire|flush`` (module doc)."""

    def __init__(
        self,
        ctx: EngineContext,
        *,
        notify_incoming: Callable[[str], None],
        enqueue_deferred: Callable[[str], None],
    ) -> None:
        """Callbacks: a message is in incoming/ now; one in deferred/ is due now."""
        self.ctx = ctx
        self.notify_incoming = notify_incoming
        self.enqueue_deferred = enqueue_deferred
        self.settle_timeout = SETTLE_TIMEOUT

    async def operate(
        self, op: Operation, queue_ids: Sequence[str] | None, *, queue: str | None = None
    ) -> dict[str, str]:
        """Apply ``op`` to each id (None = ALL, or ALL of ``queue``); a result per id."""
        ctx = self.ctx
        op = Operation(op)
        if queue is not None and queue not in op.sources:
            raise ValueError(f"{op.value} takes a queue among {', '.join(op.sources)}")
        if queue_ids is None:
            sources = op.all_sources if queue is None else (queue,)
            listed = await ctx.io.submit(
                lambda: [q for src in sources if src != "active" for q in ctx.spool.list_ids(src)]
            )
            in_core = [] if op is Operation.RELEASE or "active" not in sources else [
                r.queue_id for s in MessageState if s is not MessageState.WAITING
                for r in ctx.table.in_state(s)
            ]
            queue_ids = sorted(set(listed) | set(in_core))
        results: dict[str, str] = {}
        for queue_id in queue_ids:
            results[queue_id] = await self._operate_one(op, queue_id, queue)
        ctx.kick()
        return results

    async def _operate_one(self, op: Operation, queue_id: str, queue: str | None) -> str:
        ctx = self.ctx
        wanted = op.sources if queue is None else (queue,)
        sources = tuple(s for s in wanted if s != "active")  # active/ is the engine's
        for _ in range(_LOOKS):
            record = ctx.table.find(queue_id)
            if record is None:
                break
            state = record.state
            if state is MessageState.WAITING and op is not Operation.EXPIRE:
                ctx.table.done(record)
                break
            if state in (MessageState.LOADING, MessageState.FINISHING):
                try:
                    await asyncio.wait_for(
                        ctx.table.settled(record).wait(), self.settle_timeout
                    )
                except TimeoutError:
                    return OpResult.error("the message is busy; try again")
                continue
            if op is Operation.RELEASE:
                return OpResult.NOT_FOUND  # not on hold yet: its hold completes with the pass
            if op is Operation.EXPIRE:
                if state is MessageState.WAITING:
                    break  # marked where it waits; the load sees the mark
                return await self._expire_active(queue_id)
            if state is MessageState.IN_CORE:
                return await self._mark(record.queue_id, op)
            ctx.table.done(record)  # RETRY: nothing in flight, the file is in active/
            sources = ("active",)
            break
        else:
            return OpResult.error("the message is busy; try again")
        return await self._on_file(op, queue_id, sources)

    async def _mark(self, queue_id: str, op: Operation) -> str:
        """Make ``op`` on an in-core message durable, then leave it to the finisher."""
        ctx = self.ctx
        record = ctx.table.find(queue_id)
        if record is None or record.state is not MessageState.IN_CORE:
            raise InvariantError(f"{queue_id}: marked while not in core")
        if record.op is op or record.op is Operation.DELETE:
            return OpResult.PENDING  # already on disk (a delete wins over the rest)
        try:
            await ctx.io.submit(lambda: mark_in_core(ctx.spool, op, queue_id))
        except InvariantError:
            raise
        except Exception as exc:
            ctx.log.error("operation failed", queue_id=queue_id, op=op.value, error=str(exc))
            return OpResult.error(str(exc))
        if record.state is MessageState.IN_CORE:
            record.op = op
        ctx.kick()
        return OpResult.PENDING

    async def _expire_active(self, queue_id: str) -> str:
        """Mark a message in ``active/`` (in core, or waiting for a finish retry): the mark is
        on disk at once, and the finisher returns what is left when the pass ends."""
        ctx = self.ctx
        record = ctx.table.find(queue_id)
        if record is None or record.active is None:
            raise InvariantError(f"{queue_id}: expired in active/ while not loaded")
        msg = record.active
        try:
            await ctx.io.submit(lambda: expire_file(msg.path))
        except InvariantError:
            raise
        except Exception as exc:
            ctx.log.error("operation failed", queue_id=queue_id, op="expire", error=str(exc))
            return OpResult.error(str(exc))
        msg.forced_expire = True
        ctx.log.info(Operation.EXPIRE.log, queue_id=queue_id)
        ctx.kick()
        return OpResult.OK

    async def _on_file(self, op: Operation, queue_id: str, sources: tuple[str, ...]) -> str:
        ctx = self.ctx
        now = ctx.clock.now()
        try:
            result = await ctx.io.submit(
                lambda: operate_file(ctx.spool, op, queue_id, sources, now)
            )
        except (OSError, SpoolError) as exc:
            result = OpResult.error(str(exc))
        if result.startswith("error"):
            ctx.log.error("operation failed", queue_id=queue_id, op=op.value, error=result)
        elif result == OpResult.OK:
            self.op_done(queue_id, op)
            if op is Operation.EXPIRE and ctx.table.find(queue_id) is None:
                # Marked in deferred/ (or incoming/): load it now, so it is returned at once.
                where = await ctx.io.submit(
                    lambda: next((q for q in ("deferred", "incoming")
                                  if ctx.spool.path(q, queue_id).is_file()), None)
                )
                if where == "deferred":
                    self.enqueue_deferred(queue_id)
                elif where == "incoming":
                    self.notify_incoming(queue_id)
        return result

    def op_done(self, queue_id: str, op: Operation) -> None:
        """Log an applied operation and pick the message up again if it is due."""
        self.ctx.log.info(op.log, queue_id=queue_id)
        if op is Operation.REQUEUE:
            self.notify_incoming(queue_id)
        elif op is Operation.RELEASE:
            self.enqueue_deferred(queue_id)

    # ------------------------------------------------------------------ flush

    async def flush_destination(self, domain: str) -> int:
        """Forget that ``domain`` is dead and retry the deferred mail that has recipients there."""
        ctx = self.ctx
        now = ctx.clock.now()
        domain = domain.strip().lower().strip("[]")
        ctx.scheduler.flush_destination(domain, now)

        def work() -> list[str]:
            matches = []
            for queue_id in ctx.spool.list_ids("deferred"):
                try:
                    qf = ctx.spool.open("deferred", queue_id)
                    recipients = qf.read_all_recipients()
                except (SpoolError, OSError):
                    continue
                if any(r.address.rpartition("@")[2].lower() == domain for r in recipients):
                    matches.append(queue_id)
            return matches

        ids = await ctx.io.submit(work)
        for queue_id in ids:
            self.enqueue_deferred(queue_id)
        return len(ids)

    async def flush_message(self, queue_id: str) -> bool:
        """Retry one deferred message now; False if it is not in ``deferred/``."""
        path = self.ctx.spool.path("deferred", queue_id)
        exists = await self.ctx.io.submit(path.is_file)
        if exists:
            self.enqueue_deferred(queue_id)
        return exists
