"""Per-client counters for the listener: Postfix's anvil(8), kept in the process.

``ClientCounters`` counts live sessions per client address and AUTH
commands per client in fixed windows of ``anvil_rate_time_unit`` (a window
starts at the client's first event, as anvil's). It decides nothing: the
server compares the numbers with ``smtpd_client_connection_count_limit`` and
``smtpd_client_auth_rate_limit`` and answers as Postfix does. Time is passed
in (``now``); nothing here reads a clock.

Memory: one entry per client with a live session, plus one per client that
sent AUTH within the last window; stale rate entries are dropped once there
are more than ``_PRUNE_AT`` of them.

With several listener processes the per-client counts must be kept in one
place, as Postfix keeps them in its one ``anvil`` server: a listener given a
:class:`SharedCounts` (``ListenerContext.anvil``; the queue manager's, asked
over a worker's notify channel, ``qmgrd.daemon.anvil``) asks it for the
client's connection count at accept and its AUTH count at AUTH, and reports
every disconnect. ``None`` from it means no answer in time: the caller then
uses its own ``ClientCounters`` (fail open to the per-process count).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from qmgrd.errors import InvariantError

__all__ = ["ClientCounters", "SharedCounts"]

_PRUNE_AT = 4096


@dataclass(slots=True, eq=False)
class _Rate:
    start: float
    count: int


class ClientCounters:
    """Live sessions per address, and AUTH rates (see the module docstring)."""

    __slots__ = ("_rates", "_sessions", "total")

    def __init__(self) -> None:
        self._sessions: dict[str, int] = {}
        self._rates: dict[str, _Rate] = {}
        self.total = 0  # live sessions, every client

    def sessions(self, addr: str) -> int:
        """Live sessions of ``addr``."""
        return self._sessions.get(addr, 0)

    def connect(self, addr: str) -> int:
        """Count a new session of ``addr``; returns its live sessions, this one included."""
        count = self._sessions.get(addr, 0) + 1
        self._sessions[addr] = count
        self.total += 1
        return count

    def disconnect(self, addr: str) -> None:
        count = self._sessions.get(addr, 0)
        if count < 1 or self.total < 1:
            raise InvariantError(f"disconnect of {addr!r} without a session")
        self.total -= 1
        if count == 1:
            del self._sessions[addr]
        else:
            self._sessions[addr] = count - 1

    def auth_event(self, addr: str, now: float, unit: float) -> int:
        """Count an AUTH command of ``addr``; returns the count in its current window."""
        rate = self._rates.get(addr)
        if rate is None or now - rate.start >= unit or now < rate.start:
            if rate is None and len(self._rates) >= _PRUNE_AT:
                self._prune(now, unit)
            rate = self._rates[addr] = _Rate(now, 0)
        rate.count += 1
        return rate.count

    def _prune(self, now: float, unit: float) -> None:
        for addr in [a for a, r in self._rates.items() if not 0 <= now - r.start < unit]:
            del self._rates[addr]


class SharedCounts(Protocol):
    """Per-client counts kept for every listener process (Postfix's anvil; module doc)."""

    async def connect(self, addr: str) -> int | None:
        """Count a session of ``addr``: its live sessions everywhere, or None (no answer)."""
        ...

    def disconnect(self, addr: str) -> None:
        """A session counted with ``connect`` ended (always called, answered or not)."""
        ...

    async def auth_event(self, addr: str, unit: float) -> int | None:
        """Count an AUTH of ``addr``: its count in the window ``unit``, or None (no answer)."""
        ...
