"""The contract between the engine and delivery agents (DESIGN §6).

An agent takes one entry (a batch of recipients of one message for one
destination) and returns a result; it never raises for remote problems.
The engine, not the agent, writes done marks and defer/bounce reasons
(DESIGN §9), so the result carries everything the engine needs:

- a status per recipient (sent / deferred / bounced, DSN code, reply text);
- a hop status, set only when the *destination* failed (no address could be
  connected, greeting not 2xx, EHLO refused, required TLS failed, connection
  lost or timed out before the transaction completed). A hop status is
  negative concurrency feedback; its absence is positive feedback, even when
  every recipient was deferred by a 4xx reply (notes §8, §10.4);
- ``throttle``, set together with the hop status when the destination did
  not fail but refused the session: "full" (a 421 greeting or a refused
  connection: a concurrency limit) or "rate" (a throttling reply). Every
  recipient is then deferred and none was tried, so the engine may hand the
  entry to ``Scheduler.entry_throttled`` instead of recording the deferrals;
  an engine that ignores it behaves as before (the hop status is there).

Content is streamed from the queue file: ``ContentSource`` names the byte
range of the message content inside it (and holds the bytes, ``data``, when
the queue manager's load read them already).
"""

from __future__ import annotations

import enum
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Literal, Protocol

from qmgrd.errors import InvariantError

Throttle = Literal["full", "rate"]


class Outcome(enum.Enum):
    """What happened to one recipient in one delivery attempt."""

    SENT = "sent"
    DEFERRED = "deferred"
    BOUNCED = "bounced"


class ContentSource(Protocol):
    """Where an agent reads the message content (headers + body, as received)."""

    @property
    def size(self) -> int:
        """Content size in bytes (for the SIZE= parameter)."""
        ...

    @property
    def data(self) -> bytes | None:
        """The whole content when the source holds it in memory already, else None.

        ``chunks`` then yields exactly these bytes, in ``chunk_size`` pieces; the SMTP agent
        sends small content from here without the async iteration.
        """
        ...

    def chunks(self, chunk_size: int = 65536) -> AsyncIterator[bytes]:
        """Yield the raw content bytes in order, reading the queue file off the loop."""
        ...


def _setters(cls: type, names: str) -> tuple[Callable[[object, object], None], ...]:
    """The slot setters of a frozen slotted dataclass, for its own ``__init__``: the
    generated one calls ``object.__setattr__`` per field, about three times the cost (these
    objects are built per delivery); the class stays frozen (its ``__setattr__`` refuses)."""
    return tuple(cls.__dict__[name].__set__ for name in names.split())


_NO_NOTIFY: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True, init=False)
class Recipient:
    """A recipient as handed to an agent: its address and where its record lives."""

    address: str
    offset: int  # file offset of its R record, for the done mark
    orcpt: str | None = None  # DSN ORCPT (e.g. "rfc822;a@b")
    notify: frozenset[str] = frozenset()  # DSN NOTIFY keywords: SUCCESS, FAILURE, DELAY, NEVER

    def __init__(
        self,
        address: str,
        offset: int,
        orcpt: str | None = None,
        notify: frozenset[str] = _NO_NOTIFY,
    ) -> None:
        """The fields, in order (see ``_setters``)."""
        _R_ADDRESS(self, address)
        _R_OFFSET(self, offset)
        _R_ORCPT(self, orcpt)
        _R_NOTIFY(self, notify)


_R_ADDRESS, _R_OFFSET, _R_ORCPT, _R_NOTIFY = _setters(Recipient, "address offset orcpt notify")


@dataclass(frozen=True, slots=True, init=False)
class DeliveryRequest:
    """One entry: up to ``<transport>_destination_recipient_limit`` recipients, one nexthop."""

    queue_id: str
    transport: str  # master.cf service name
    nexthop: str  # e.g. "example.com", "[127.0.0.1]:2525", or the error/retry text
    sender: str  # "" = null sender
    recipients: tuple[Recipient, ...]
    content: ContentSource
    smtputf8: bool = False  # the message needs SMTPUTF8
    body_8bitmime: bool = False  # BODY=8BITMIME was given at intake
    envid: str | None = None  # DSN ENVID
    ret: str | None = None  # DSN RET (FULL | HDRS)
    cache_load: bool = False  # qmgr LOAD flag: may use a cached session
    cache_store: bool = False  # qmgr STORE flag: may keep the session for the next entry

    def __init__(
        self,
        queue_id: str,
        transport: str,
        nexthop: str,
        sender: str,
        recipients: tuple[Recipient, ...],
        content: ContentSource,
        smtputf8: bool = False,
        body_8bitmime: bool = False,
        envid: str | None = None,
        ret: str | None = None,
        cache_load: bool = False,
        cache_store: bool = False,
    ) -> None:
        """The fields, in order (see ``_setters``)."""
        _Q_QUEUE_ID(self, queue_id)
        _Q_TRANSPORT(self, transport)
        _Q_NEXTHOP(self, nexthop)
        _Q_SENDER(self, sender)
        _Q_RECIPIENTS(self, recipients)
        _Q_CONTENT(self, content)
        _Q_SMTPUTF8(self, smtputf8)
        _Q_BODY_8BITMIME(self, body_8bitmime)
        _Q_ENVID(self, envid)
        _Q_RET(self, ret)
        _Q_CACHE_LOAD(self, cache_load)
        _Q_CACHE_STORE(self, cache_store)


(
    _Q_QUEUE_ID,
    _Q_TRANSPORT,
    _Q_NEXTHOP,
    _Q_SENDER,
    _Q_RECIPIENTS,
    _Q_CONTENT,
    _Q_SMTPUTF8,
    _Q_BODY_8BITMIME,
    _Q_ENVID,
    _Q_RET,
    _Q_CACHE_LOAD,
    _Q_CACHE_STORE,
) = _setters(
    DeliveryRequest,
    "queue_id transport nexthop sender recipients content smtputf8 body_8bitmime envid ret"
    " cache_load cache_store",
)


@dataclass(frozen=True, slots=True, init=False)
class RecipientResult:
    """The outcome for one recipient, with the DSN code and the text that explains it."""

    recipient: Recipient
    outcome: Outcome
    dsn: str  # enhanced status code, e.g. "2.0.0", "4.4.1", "5.1.1"
    reply: str  # remote reply ("250 2.0.0 Ok") or local reason
    relay: str = "none"  # "host[addr]:port" of the server that gave the reply

    def __init__(
        self, recipient: Recipient, outcome: Outcome, dsn: str, reply: str, relay: str = "none"
    ) -> None:
        """The fields, in order (see ``_setters``)."""
        _RR_RECIPIENT(self, recipient)
        _RR_OUTCOME(self, outcome)
        _RR_DSN(self, dsn)
        _RR_REPLY(self, reply)
        _RR_RELAY(self, relay)


_RR_RECIPIENT, _RR_OUTCOME, _RR_DSN, _RR_REPLY, _RR_RELAY = _setters(
    RecipientResult, "recipient outcome dsn reply relay"
)


@dataclass(frozen=True, slots=True)
class HopStatus:
    """A destination-level failure: negative feedback for the destination's window."""

    dsn: str  # e.g. "4.4.1"
    reason: str  # e.g. "connect to mx.example.com[192.0.2.1]:25: Connection refused"


@dataclass(frozen=True, slots=True, init=False)
class DeliveryResult:
    """Everything the engine learns from one delivery attempt."""

    recipients: tuple[RecipientResult, ...]
    hop: HopStatus | None = None
    conn_setup_time: float = 0.0  # seconds spent in DNS, connect, greeting, EHLO, TLS
    transmission_time: float = 0.0  # seconds spent in MAIL..end of DATA
    extra: dict[str, str] = field(default_factory=dict)  # agent-specific notes for logs
    throttle: Throttle | None = None  # set only with ``hop`` (module doc); last: callers pass
    # the fields above by position

    def __init__(
        self,
        recipients: tuple[RecipientResult, ...],
        hop: HopStatus | None = None,
        conn_setup_time: float = 0.0,
        transmission_time: float = 0.0,
        extra: dict[str, str] | None = None,
        throttle: Throttle | None = None,
    ) -> None:
        """The fields, in order (see ``_setters``; ``extra`` None: a new empty dict).

        A throttle without a hop status is a bug in the agent.
        """
        if throttle is not None and hop is None:
            raise InvariantError("DeliveryResult.throttle needs a hop status")
        _DR_RECIPIENTS(self, recipients)
        _DR_HOP(self, hop)
        _DR_CONN_SETUP_TIME(self, conn_setup_time)
        _DR_TRANSMISSION_TIME(self, transmission_time)
        _DR_EXTRA(self, {} if extra is None else extra)
        _DR_THROTTLE(self, throttle)


(
    _DR_RECIPIENTS,
    _DR_HOP,
    _DR_CONN_SETUP_TIME,
    _DR_TRANSMISSION_TIME,
    _DR_EXTRA,
    _DR_THROTTLE,
) = _setters(DeliveryResult, "recipients hop conn_setup_time transmission_time extra throttle")


class Agent(Protocol):
    """A delivery agent: one ``deliver`` call per entry; many may run concurrently."""

    async def deliver(self, request: DeliveryRequest) -> DeliveryResult:
        """Attempt delivery; every remote or local problem becomes a result, never an exception."""
        ...

    async def close(self) -> None:
        """Release cached connections and other resources (QUIT idle sessions)."""
        ...
