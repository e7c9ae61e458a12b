"""The operator's vocabulary: operations on queued mail and their results, typed once.

Contract
--------
:class:`Operation` names what ``qmgrd hold|release|delete|requeue|expire``
(Postfix's ``postsuper -h|-H|-d|-r|-e``) ask for. The same values travel end to end: the CLI
sub-command, the control protocol's ``op`` field, the engine and the offline
spool side (``qmgrd.ops.spoolops``). Being a ``StrEnum``, an operation is its
own wire spelling (``Operation.HOLD == "hold"``); ``Operation.parse(text)``
turns a wire value back into one (ValueError for anything else).

Each operation knows:

- ``sources``: the queues it takes messages from (``ALL`` lists them; for
  ``hold`` without the ``hold`` queue itself);
- ``summary``: postsuper's summary word (``Placed on hold``, ``Deleted``...);
- ``log``: the queue manager's log line when the daemon applies it.

:class:`OpResult` is the per-message answer: ``ok``, ``not found``,
``pending`` (the message is being delivered; the operation is on disk already
and completes when that delivery ends) or ``error: TEXT``.
"""

from __future__ import annotations

import enum

__all__ = ["ACTIVE_SOURCES", "OpResult", "Operation"]

ACTIVE_SOURCES = ("incoming", "active", "deferred", "hold")
"""Every queue an operator operation may find a message in (``active/`` offline only)."""


class Operation(enum.StrEnum):
    """hold / release / delete / requeue / expire (see the module doc)."""

    HOLD = "hold"
    RELEASE = "release"
    DELETE = "delete"
    REQUEUE = "requeue"
    EXPIRE = "expire"  # postsuper -e: the forced-expire mark (qmgrd.spool.marks)

    @classmethod
    def parse(cls, text: str) -> Operation:
        """The operation spelled ``text``; ValueError naming the known ones otherwise."""
        try:
            return cls(text)
        except ValueError:
            known = ", ".join(op.value for op in cls)
            raise ValueError(f"unknown operation {text!r} (expected one of: {known})") from None

    @property
    def sources(self) -> tuple[str, ...]:
        """The queues this operation takes a message from (``active/`` for a stopped daemon)."""
        return ("hold",) if self is Operation.RELEASE else ACTIVE_SOURCES

    @property
    def all_sources(self) -> tuple[str, ...]:
        """The queues ``ALL`` lists: held mail is not held again."""
        return tuple(q for q in self.sources if not (self is Operation.HOLD and q == "hold"))

    @property
    def summary(self) -> str:
        """postsuper's summary word: ``qmgrd: Deleted: 3 messages``."""
        return _SUMMARY[self]

    @property
    def log(self) -> str:
        """The queue manager's log line once the operation is applied."""
        return _LOG[self]


_SUMMARY = {
    Operation.HOLD: "Placed on hold",
    Operation.RELEASE: "Released from hold",
    Operation.DELETE: "Deleted",
    Operation.REQUEUE: "Requeued",
    Operation.EXPIRE: "Expired",
}
_LOG = {
    Operation.HOLD: "held by the operator",
    Operation.RELEASE: "released from hold",
    Operation.DELETE: "removed by the operator",
    Operation.REQUEUE: "requeued",
    Operation.EXPIRE: "forced to expire by the operator",
}


class OpResult(enum.StrEnum):
    """The answer for one queue id (``error: TEXT`` is built by :func:`OpResult.error`)."""

    OK = "ok"
    NOT_FOUND = "not found"
    PENDING = "pending"

    @staticmethod
    def error(text: str) -> str:
        """The result string of a failed operation."""
        return f"error: {text}"
