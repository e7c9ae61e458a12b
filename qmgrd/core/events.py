"""Events the scheduler reports to the engine, drained with ``Scheduler.pop_events()``.

Contract
--------
Events are plain frozen values, in the order things happened:

- :class:`MessageDone`: the message has no live entries and is fully read (Postfix
  ``active_done`` after the last batch). The core has already freed it; the engine decides
  delete / defer / bounce from its own per-recipient records.
- :class:`RecipientsDeferred`: recipients that were not delivered because their destination or
  transport is dead (entries deferred from a dead queue's todo list, or recipients resolved to a
  dead destination in ``recipients_add``). The engine records them as deferred with ``status`` and
  ``reason`` (Postfix moves them to the retry transport; we report them directly).
- :class:`DestinationThrottled`: a refused session was put back instead of failing (learned
  limits, ``Scheduler.entry_throttled``): for the log and metrics.
- :class:`DestinationDead` / :class:`DestinationRevived`, :class:`TransportDead` /
  :class:`TransportRevived`: state changes for the log.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from qmgrd.core.message import Message, ResolvedRecipient

__all__ = [
    "DestinationDead",
    "DestinationRevived",
    "DestinationThrottled",
    "Event",
    "MessageDone",
    "RecipientsDeferred",
    "TransportDead",
    "TransportRevived",
]


@dataclass(frozen=True, slots=True, init=False)
class MessageDone:
    """The message is finished in core: no live entries, nothing left to read."""

    message: Message

    def __init__(self, message: Message) -> None:
        """The slot set directly (one per message; ``qmgrd.core.message._setters``)."""
        _MD_MESSAGE(self, message)


_MD_MESSAGE = MessageDone.__dict__["message"].__set__


@dataclass(frozen=True, slots=True)
class RecipientsDeferred:
    """Recipients deferred without a delivery attempt (dead destination or transport)."""

    message: Message
    recipients: tuple[ResolvedRecipient, ...]
    status: str  # DSN status, e.g. "4.4.1"
    reason: str


@dataclass(frozen=True, slots=True)
class DestinationDead:
    """A destination queue was declared dead by negative feedback."""

    transport: str
    queue_name: str
    nexthop: str
    status: str
    reason: str
    shared: bool = False  # the verdict came from another node (cluster destination gate)


@dataclass(frozen=True, slots=True)
class DestinationRevived:
    """A dead destination queue is usable again (timer, successful delivery or flush)."""

    transport: str
    queue_name: str


@dataclass(frozen=True, slots=True)
class DestinationThrottled:
    """A session was refused by a full or throttling destination; its entry was put back.

    ``kind`` is "full" (the window settled at ``window``) or "rate" (deliveries paused for
    ``hold`` seconds, then the window resumes at ``window``); ``reason`` is the remote reply.
    """

    transport: str
    queue_name: str
    kind: str
    window: int
    hold: float
    reason: str


@dataclass(frozen=True, slots=True)
class TransportDead:
    """A transport's agent could not run; its recipients are deferred until it revives."""

    transport: str
    status: str
    reason: str


@dataclass(frozen=True, slots=True)
class TransportRevived:
    """A dead transport is usable again."""

    transport: str


Event = (
    MessageDone
    | RecipientsDeferred
    | DestinationDead
    | DestinationRevived
    | DestinationThrottled
    | TransportDead
    | TransportRevived
)
