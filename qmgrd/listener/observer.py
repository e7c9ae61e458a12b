"""What the SMTP listener reports to whoever watches it (intake metrics), without knowing them.

The listener calls an :class:`IntakeObserver` (``ListenerContext.observer``;
:data:`NULL_INTAKE` when none is given) at a few points, each a one-line call
that never raises and never blocks. The daemon's Prometheus implementation is
``qmgrd.daemon.metrics_intake.IntakeMetrics``; the listener imports nothing of
the daemon (imports point cli -> daemon -> listener).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

__all__ = ["NULL_INTAKE", "Committed", "IntakeObserver"]


@dataclass(frozen=True, slots=True)
class Committed:
    """A message the listener committed to ``incoming/`` (``ListenerContext.on_commit``'s argument).

    Besides the queue id it carries what the queue manager may want to know of
    a new file without reading it: the envelope sender, the client's address
    and the SASL user (None without AUTH), and the recipient count.
    """

    queue_id: str
    sender: str
    client_addr: str
    sasl_user: str | None
    recipients: int


class IntakeObserver(Protocol):
    """What the listener reports (see the module doc); every method is cheap and never raises."""

    def connected(self) -> None:
        """A connection was accepted."""

    def rejected(self, reason: str) -> None:
        """A connection was refused before its session (``reason``: a REJECT_REASONS value)."""

    def session_started(self) -> None:
        """A session began."""

    def session_ended(self) -> None:
        """A session ended."""

    def replied(self, text: str) -> None:
        """The session sent the 4xx or 5xx reply line ``text`` (positive replies are not
        reported: nothing counts them, and a session sends several per message)."""

    def message_accepted(self, recipients: int) -> None:
        """A message with ``recipients`` recipients was queued."""

    def auth_failed(self, mechanism: str) -> None:
        """An AUTH exchange with ``mechanism`` failed."""


class _NullIntake:
    """The observer of a listener nobody watches."""

    __slots__ = ()

    def connected(self) -> None:
        """Nothing."""

    def rejected(self, reason: str) -> None:
        """Nothing."""

    def session_started(self) -> None:
        """Nothing."""

    def session_ended(self) -> None:
        """Nothing."""

    def replied(self, text: str) -> None:
        """Nothing."""

    def message_accepted(self, recipients: int) -> None:
        """Nothing."""

    def auth_failed(self, mechanism: str) -> None:
        """Nothing."""


NULL_INTAKE: IntakeObserver = _NullIntake()
