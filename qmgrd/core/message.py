"""In-core messages, resolved recipients and read requests (notes §2.4, §3.3).

Contract
--------
A :class:`Message` is one queue file in the active queue. The scheduler creates it
(``Scheduler.message_create``) and frees it after reporting it finished; the engine never changes
its fields, except ``payload``, an opaque slot the engine owns.

The core never reads files. It asks for recipients with a :class:`ReadRequest` ("read up to
``limit`` recipients of ``message`` starting at file offset ``offset``") and later receives them,
already resolved, as :class:`ResolvedRecipient` values.

Read state (the rule for asynchronous reads):
- ``more`` is True while the queue file may hold unread recipients, including while a read is in
  flight (Postfix's ``rcpt_offset != 0``).
- ``reading`` is True while a read request is outstanding; no second read of the same message is
  requested until the batch arrives.
- ``reserved`` is the budget of the outstanding read. Slot transfers out of the message
  (``move_limits``) treat it as already in core, so the slots the read will use are never given
  away while it is in flight (the synchronous Postfix read has no such window).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from qmgrd.core.flow import FLOW_NONE, Flow

if TYPE_CHECKING:
    from qmgrd.core.job import Job

__all__ = ["Message", "ReadRequest", "ResolvedRecipient"]


def _setters(cls: type, names: str) -> tuple[Callable[[object, object], None], ...]:
    """The slot setters of a frozen slotted dataclass, for its own ``__init__``.

    The generated ``__init__`` of a frozen dataclass calls ``object.__setattr__`` per field,
    about twice the cost of the slot's own setter (callgrind); one ``ResolvedRecipient`` is
    built per recipient and one ``ReadRequest`` per read. The class stays frozen: its
    ``__setattr__`` still refuses, and ``==``, ``hash`` and ``repr`` are the generated ones.
    ``tests/unit/core/test_message_types.py`` checks each ``__init__`` takes every field.
    """
    return tuple(cls.__dict__[name].__set__ for name in names.split())


@dataclass(frozen=True, slots=True, init=False)
class ResolvedRecipient:
    """A recipient read from the queue file and resolved by the engine (notes §3.4).

    ``queue_name`` is the destination queue key (``resolve.queue_name``): the nexthop, or
    ``localpart@nexthop`` for per-recipient transports. ``payload`` is opaque to the core (the
    engine keeps DSN attributes there) and travels with the recipient into the entry.
    """

    address: str
    offset: int  # file offset of the R record, for the done mark
    transport: str
    nexthop: str
    queue_name: str
    payload: object = None

    def __init__(
        self,
        address: str,
        offset: int,
        transport: str,
        nexthop: str,
        queue_name: str,
        payload: object = None,
    ) -> None:
        """The fields, in order, each slot set directly (see ``_setters``)."""
        _RR_ADDRESS(self, address)
        _RR_OFFSET(self, offset)
        _RR_TRANSPORT(self, transport)
        _RR_NEXTHOP(self, nexthop)
        _RR_QUEUE_NAME(self, queue_name)
        _RR_PAYLOAD(self, payload)


@dataclass(frozen=True, slots=True, init=False)
class ReadRequest:
    """Ask the engine to read up to ``limit`` recipients of ``message`` from ``offset``."""

    message: Message
    offset: int
    limit: int

    def __init__(self, message: Message, offset: int, limit: int) -> None:
        """The fields, in order, each slot set directly (see ``_setters``)."""
        _RQ_MESSAGE(self, message)
        _RQ_OFFSET(self, offset)
        _RQ_LIMIT(self, limit)


_RR_ADDRESS, _RR_OFFSET, _RR_TRANSPORT, _RR_NEXTHOP, _RR_QUEUE_NAME, _RR_PAYLOAD = _setters(
    ResolvedRecipient, "address offset transport nexthop queue_name payload"
)
_RQ_MESSAGE, _RQ_OFFSET, _RQ_LIMIT = _setters(ReadRequest, "message offset limit")


@dataclass(slots=True, eq=False)
class Message:
    """One queue file in the active queue (notes §2.4)."""

    queue_id: str
    queued_time: float  # when it entered the active queue: the job age for preemption
    rcpt_unread: int  # recipients not yet read (size-record count; an upper bound)
    rcpt_limit: int  # in-core recipient allowance; starts at qmgr_message_recipient_minimum
    single_rcpt: bool = False  # VERP: one recipient per entry
    payload: object = None  # the engine's slot
    rcpt_offset: int = 0  # file offset to resume reading recipients
    more: bool = True  # unread recipients may remain (or a read is in flight)
    reading: bool = False  # a read request is outstanding
    reserved: int = 0  # budget of the outstanding read
    pending_read: ReadRequest | None = None  # the outstanding request, for introspection
    rcpt_count: int = 0  # recipients in core
    refcount: int = 0  # live entries
    refill_time: float = 0.0  # when the last batch arrived
    refill_timer_at: float | None = None  # pending refill-delay wake-up (lazy heap token)
    jobs: dict[str, Job] = field(default_factory=dict)  # by transport name
    finished: bool = False  # reported done and freed
    flow: Flow = FLOW_NONE  # fairness flow (qmgrd.daemon.flows); FLOW_NONE = fairness none
    transport_flows: Mapping[str, Flow] | None = None  # per-transport flows overriding ``flow``

    def flow_for(self, transport: str) -> Flow:
        """The message's flow on ``transport``."""
        flows = self.transport_flows
        if flows:
            found = flows.get(transport)
            if found is not None:
                return found
        return self.flow
