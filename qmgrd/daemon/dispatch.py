"""Dispatch: hand the scheduler's entries to delivery agents and report back.

Contract (Postfix's ``qmgr_deliver``)
--------------------------------------
``drain(now)`` asks the scheduler for entries until it has none and starts
one delivery task per entry, except:

- an entry of a message the operator marked (hold, delete, requeue) is
  returned unattempted (a "crash": no feedback, nothing marked; its
  recipients stay R for whoever gets the file next);
- an entry whose transport has no agent fails the transport
  (``4.3.0 mail transport unavailable``), as Postfix does for a missing
  ``master.cf`` service.

A delivery calls the agent and guards its contract: an agent that raises is
a crash (every recipient deferred with ``4.3.0 unknown mail transport
error``), an agent that returns too few results gets ``4.3.0 delivery agent
gave no result`` for the missing ones. A session refused because the destination is
full or throttling (``result.throttle``) hands the entry back to the scheduler
(``entry_throttled``: its destination's todo list, no feedback) when the scheduler
accepts that reading; otherwise it is an ordinary hop failure. The scheduler
gets the delivery's real duration (``service_time``, for fair queuing's G - S
correction). With a destination gate (``ctx.gate``, cluster: ``qmgrd.daemon.destgate``)
a delivery starts only once the gate admits it, and the gate hears its outcome first.
The content of a small message is read once for all its deliveries in flight
(``qmgrd.daemon.sharedread``). The outcome is recorded
(``qmgrd.daemon.outcomes``) and only then does the scheduler hear of the
entry: exactly once, whatever fails in between, so a message can never hang
in core waiting for an entry nobody will complete.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any

from qmgrd.core.entry import DFLAG_LOAD, DFLAG_STORE, Entry
from qmgrd.core.message import ResolvedRecipient
from qmgrd.daemon.context import EngineContext
from qmgrd.daemon.outcomes import Recorder
from qmgrd.daemon.sharedread import SharedReads
from qmgrd.daemon.table import active_of, record_of
from qmgrd.delivery.agent import (
    Agent,
    DeliveryRequest,
    DeliveryResult,
    Outcome,
    Recipient,
    RecipientResult,
)
from qmgrd.errors import InvariantError

__all__ = [
    "CRASH_DSN", "CRASH_REASON", "NO_TRANSPORT_REASON", "Dispatcher", "close_agents", "complete"
]

CRASH_DSN = "4.3.0"
CRASH_REASON = "unknown mail transport error"
NO_TRANSPORT_REASON = "mail transport unavailable"
NO_RESULT_REASON = "delivery agent gave no result"


class Dispatcher:
    """Starts deliveries for the scheduler's entries (see the module doc)."""

    def __init__(self, ctx: EngineContext, recorder: Recorder) -> None:
        """``recorder`` makes each delivery's outcome durable and logs it."""
        self.ctx = ctx
        self.recorder = recorder
        self.reads = SharedReads(ctx.io.submit)  # one content read per small message

    def drain(self, now: float) -> None:
        """Start a delivery for every entry the scheduler selects now."""
        ctx = self.ctx
        if ctx.stopping:
            return
        while True:
            entry = ctx.scheduler.select(now)
            if entry is None:
                return
            record = ctx.table.find(entry.message.queue_id)
            if record is None:
                raise InvariantError(f"{entry.message.queue_id}: in core but not in the table")
            if record.op is not None or active_of(entry.message).forced_expire:
                # Held, deleted, requeued or expired by the operator: hand nothing more out;
                # the recipients stay R (a "crash" gives no feedback and marks nothing).
                active_of(entry.message).deferred = True  # never "all done" with R left
                ctx.scheduler.entry_done(entry, crashed=True, now=now, service_time=0.0)
                continue
            agent = ctx.agents.get(entry.queue.transport.name)  # entry.transport, inlined
            if agent is None:
                ctx.scheduler.transport_failed(
                    entry.transport, CRASH_DSN, NO_TRANSPORT_REASON, now, entry=entry
                )
                continue
            ctx.spawn(self.deliver(entry, agent, now), delivery=True)

    async def deliver(self, entry: Entry, agent: Agent, started: float) -> None:
        """One delivery: the agent, then the record of its outcome, then the scheduler."""
        ctx = self.ctx
        msg = active_of(entry.message)
        qf = msg.qf
        # --- cluster (qmgrd.daemon.destgate): shared leases, dead verdicts and rates ---
        gate = ctx.gate if ctx.gate is not None and ctx.gate.active else None
        lease = await gate.before(entry) if gate is not None else None
        if gate is not None and lease is None:
            return  # not started: the gate put the entry back or had the core defer it
        # --- end cluster ---
        recipients = tuple([_agent_recipient(r) for r in entry.recipients])
        content = self.reads.content(msg)  # released when the agent is done with it
        # Entry's properties (transport, nexthop, cache_load, cache_store), inlined: a
        # property is a Python call each on 3.11.
        queue = entry.queue
        dflags = entry.dflags
        request = DeliveryRequest(  # positional, in field order: 12 keywords cost ~40 % more
            msg.queue_id,
            queue.transport.name,  # transport
            queue.nexthop,  # nexthop
            qf.sender,
            recipients,
            content,
            qf.smtputf8,  # smtputf8
            qf.body == "8BITMIME",  # body_8bitmime
            qf.envid,  # envid
            qf.ret,  # ret
            bool(dflags & DFLAG_LOAD),  # cache_load
            bool(dflags & DFLAG_STORE),  # cache_store
        )
        crashed = False
        try:
            result = await agent.deliver(request)
        except asyncio.CancelledError:
            # Shutdown: the recipients stay R in active/ and are recovered at the next start.
            raise
        except InvariantError:
            raise  # a bug, wherever it is: the daemon stops
        except Exception as exc:
            ctx.log.error(
                "delivery agent failed",
                queue_id=msg.queue_id,
                transport=entry.transport,
                error=repr(exc),
            )
            crashed = True
            result = DeliveryResult(
                tuple(
                    RecipientResult(r, Outcome.DEFERRED, CRASH_DSN, CRASH_REASON)
                    for r in recipients
                )
            )
        finally:
            self.reads.release(msg, content)
        result = complete(result, recipients)
        if gate is not None and lease is not None and await gate.after(
            entry, lease, result, crashed
        ):
            return  # cluster: a full destination refused the session; the entry went back
        now = ctx.clock.now()
        hop = (result.hop.dsn, result.hop.reason) if result.hop else None
        if (
            not crashed
            and result.throttle is not None
            and hop is not None
            and ctx.scheduler.entry_throttled(entry, kind=result.throttle, hop=hop, now=now)
        ):
            # The destination was full or asked us to slow down: the entry went back to its
            # todo list untouched (nothing recorded, no feedback, no deferral to disk).
            ctx.log.info(
                "throttled",
                queue_id=msg.queue_id,
                transport=entry.transport,
                nexthop=entry.nexthop,
                kind=result.throttle,
                reason=result.hop.reason if result.hop else "",
            )
            ctx.kick()
            return
        # The message's last entry: its record's file job may remove the file (outcomes).
        last = ctx.table.find(msg.queue_id) if ctx.scheduler.completes_message(entry) else None
        try:
            await self.recorder.record(msg, result, now, last)
            self.recorder.log_results(msg, entry, result, started, now)
        finally:
            # Exactly once, even if recording failed: the message must be able to finish.
            ctx.stats.deliveries += 1
            ctx.scheduler.entry_done(
                entry, hop_failure=hop, crashed=crashed, now=now, service_time=now - started
            )
            ctx.kick()


def _agent_recipient(rcpt: ResolvedRecipient) -> Recipient:
    record = record_of(rcpt)
    return Recipient(record.address, record.offset, record.orcpt, record.notify)


def complete(result: DeliveryResult, recipients: tuple[Recipient, ...]) -> DeliveryResult:
    """Guard the agent contract: every recipient handed out gets exactly one result."""
    got = result.recipients
    if len(got) == 1 and len(recipients) == 1 and got[0].recipient is recipients[0]:
        return result  # the common case, without the set and the list below
    seen = {id(r.recipient) for r in got}
    missing = [r for r in recipients if id(r) not in seen]
    if not missing:
        return result
    extra = tuple(
        RecipientResult(r, Outcome.DEFERRED, CRASH_DSN, NO_RESULT_REASON) for r in missing
    )
    return DeliveryResult(
        result.recipients + extra,
        result.hop,
        result.conn_setup_time,
        result.transmission_time,
        result.extra,
    )


async def close_agents(agents: Iterable[Agent], log: Any) -> None:
    """Close ``agents``; a failure is logged, never raised (it must not stop a shutdown)."""
    for agent in agents:
        try:
            await agent.close()
        except Exception as exc:
            log.warning("agent close failed", error=repr(exc))
