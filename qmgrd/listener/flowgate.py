"""The listener's hook into fair admission: refuse a flow over its backlog, name the flow of a
committed message (issue 15; docs/fairness-admission.md).

Contract
--------
The listener calls a :class:`FlowGate` (``ListenerContext.gate``; :data:`NULL_GATE` when
none is given) at two points, each a one-line, non-blocking call that never raises:

- ``refuse(facts)`` at ``MAIL FROM`` once the sender is parsed and the other MAIL checks
  passed: a reply line (``452 4.3.2 ...``) when the message's flow has
  ``qmgr_flow_backlog_limit`` messages waiting for the active queue, else None. Only that
  flow is refused; every other flow is accepted as usual. MAIL, not RCPT: the flow keys
  (sender, sender domain, SASL user, client address) are all known there, and a refused
  sender sends no recipients for nothing.
- ``committed(queue_id, facts)`` right before ``on_commit(queue_id)``: the flow of the file
  just committed to ``incoming/``, so the queue manager queues it under its flow without
  reading the file.

:class:`FlowFacts` is what a flow is computed from: three strings, picklable, so a listener in
another process can send it. What an implementation needs when listeners run in worker
processes (the daemon's is ``qmgrd.daemon.admitting.EngineFlowGate``, in-process):

- for ``refuse``: the fairness settings (to compute the flow key from the facts) and the set
  of flow keys over their backlog limit (small: only flows over the limit), refreshed by the
  queue manager when it changes; a stale answer only delays or lets through one message;
- for ``committed``: a message to the queue manager with the queue id and the facts, or
  nothing at all: the queue manager then reads the envelope head of the file it is told
  about (bounded, the same reader as its start-up scan).

The listener imports nothing of the daemon (imports point cli -> daemon -> listener).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

__all__ = ["NULL_GATE", "FlowFacts", "FlowGate"]


@dataclass(frozen=True, slots=True)
class FlowFacts:
    """What a message's flow is computed from (a ``FlowEnvelope``)."""

    sender: str  # "" = null sender
    client_addr: str | None = None  # None: not from the network (pickup, notices)
    sasl_username: str | None = None  # None: not authenticated


class FlowGate(Protocol):
    """Fair admission's view of intake (see the module doc); cheap, never raises."""

    def refuse(self, facts: FlowFacts) -> str | None:
        """The reply refusing MAIL FROM for this flow, or None to accept it."""

    def committed(self, queue_id: str, facts: FlowFacts) -> None:
        """``queue_id`` was committed to ``incoming/`` with these facts."""


class _OpenGate:
    """The gate of a listener without fair admission: accepts everything, notes nothing."""

    __slots__ = ()

    def refuse(self, facts: FlowFacts) -> str | None:
        """Never refuses."""
        return None

    def committed(self, queue_id: str, facts: FlowFacts) -> None:
        """Nothing."""


NULL_GATE: FlowGate = _OpenGate()
