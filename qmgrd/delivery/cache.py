"""Idle SMTP session cache (Postfix scache(8), in process; notes §10.2).

Contract:

- ``store(key, session)`` keeps an idle session under ``key`` (the SMTP agent
  uses ``(nexthop label, host, addr, port, tls)``) for ``ttl`` seconds
  (``smtp_connection_cache_time_limit``). Several sessions may wait under one
  key. When the TTL passes, the session is removed and closed with
  ``closer`` (QUIT, then close) in a background task; there is no polling
  loop: one ``call_later`` timer for the whole cache, armed for the oldest
  stored session's expiry and re-armed lazily when it fires (a session taken
  meanwhile is skipped then; a timer made and cancelled per store cost more
  than the expiry itself). TTLs are equal, so store order is expiry order.
- ``take(key)`` removes and returns the most recently stored session under
  ``key``, or None. The caller owns it from then on (it probes it with RSET
  and either uses it or closes it).
- ``close()`` cancels every timer, closes every idle session and waits for
  closes already under way. The cache may be used again afterwards.

Whether a session may be stored at all (age, reuse count, errors) is the
agent's decision; the cache only holds idle sessions and expires them.
The scheduler (``call_later``) is injected so tests can fire timers by hand.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar

S = TypeVar("S")


class TimerHandle(Protocol):
    """What ``loop.call_later`` returns (only ``cancel`` is used)."""

    def cancel(self) -> None: ...


CallLater = Callable[[float, Callable[[], None]], TimerHandle]


@dataclass(slots=True, eq=False)
class CacheStats:
    """Counters for tests and logs: sessions stored, reused (taken) and expired."""

    stored: int = 0
    taken: int = 0
    expired: int = 0


_SLACK = 0.001  # a timer fires up to the loop's clock resolution early: due alike


@dataclass(slots=True, eq=False)
class _Slot(Generic[S]):
    key: Hashable
    session: S
    expires: float  # loop time
    taken: bool = False


@dataclass(slots=True, eq=False)
class ConnectionCache(Generic[S]):
    """Idle sessions by key, each expiring after ``ttl`` seconds."""

    ttl: float
    closer: Callable[[S], Awaitable[None]]
    call_later: CallLater | None = None
    stats: CacheStats = field(default_factory=CacheStats)
    _slots: dict[Hashable, list[_Slot[S]]] = field(default_factory=dict)
    _closing: set[asyncio.Task[None]] = field(default_factory=set)
    _order: deque[_Slot[S]] = field(default_factory=deque)  # store order (taken ones too)
    _live: int = 0  # sessions held
    _timer: TimerHandle | None = None
    _deadline: float = 0.0  # what the timer was armed for

    def __len__(self) -> int:
        """Number of idle sessions held."""
        return self._live

    def __contains__(self, key: Hashable) -> bool:
        """Whether an idle session is stored under ``key``."""
        return bool(self._slots.get(key))

    def store(self, key: Hashable, session: S) -> None:
        """Keep an idle session under ``key`` until it is taken or its TTL passes."""
        loop = asyncio.get_running_loop()
        slot: _Slot[S] = _Slot(key, session, loop.time() + self.ttl)
        slots = self._slots.get(key)
        if slots is None:
            self._slots[key] = [slot]
        else:
            slots.append(slot)
        order = self._order
        if len(order) > 2 * self._live + 64:  # taken ones the timer has not passed yet
            self._order = order = deque(s for s in order if not s.taken)
        order.append(slot)
        self._live += 1
        self.stats.stored += 1
        if self._timer is None:
            self._arm(slot.expires, loop)

    def _arm(self, deadline: float, loop: asyncio.AbstractEventLoop) -> None:
        call_later = self.call_later or loop.call_later
        self._deadline = deadline
        self._timer = call_later(max(0.0, deadline - loop.time()), self._fire)

    def take(self, key: Hashable) -> S | None:
        """Remove and return an idle session stored under ``key`` (newest first), or None."""
        slots = self._slots.get(key)
        if not slots:
            return None
        slot = slots.pop()
        if not slots:
            del self._slots[key]
        slot.taken = True
        self._live -= 1
        self.stats.taken += 1
        return slot.session

    def _fire(self) -> None:
        """The timer: expire every session due by its deadline, re-arm for the next one."""
        self._timer = None
        due = self._deadline + _SLACK
        order = self._order
        while order and (order[0].taken or order[0].expires <= due):
            slot = order.popleft()
            if not slot.taken:
                self._expire(slot)
        if order:
            self._arm(order[0].expires, asyncio.get_running_loop())

    def _expire(self, slot: _Slot[S]) -> None:
        slots = self._slots[slot.key]
        slots.remove(slot)  # short list: sessions of one endpoint
        if not slots:
            del self._slots[slot.key]
        slot.taken = True
        self._live -= 1
        self.stats.expired += 1
        task = asyncio.get_running_loop().create_task(self._close_one(slot.session))
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    async def _close_one(self, session: S) -> None:
        try:
            await self.closer(session)
        except Exception:  # closing an idle session must never break the loop
            return

    async def close(self) -> None:
        """Close every idle session (QUIT) and wait for closes already started."""
        slots = [slot for group in self._slots.values() for slot in group]
        self._slots.clear()
        self._order.clear()
        self._live = 0
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        pending = list(self._closing)
        await asyncio.gather(
            *(self._close_one(slot.session) for slot in slots), *pending, return_exceptions=True
        )
