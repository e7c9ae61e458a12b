"""The connection cache's single expiry timer: armed for the oldest session, re-armed lazily,
taken sessions skipped, each session expiring ``ttl`` after its store."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from qmgrd.delivery.cache import ConnectionCache


class _Handle:
    def __init__(self) -> None:
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class _Timers:
    def __init__(self) -> None:
        self.armed: list[tuple[float, Callable[[], None], _Handle]] = []

    def call_later(self, delay: float, callback: Callable[[], None]) -> _Handle:
        handle = _Handle()
        self.armed.append((delay, callback, handle))
        return handle

    def fire(self) -> float:
        delay, callback, handle = self.armed.pop(0)
        assert not handle.cancelled
        callback()
        return delay


async def test_one_timer_expires_sessions_in_store_order(monkeypatch: pytest.MonkeyPatch) -> None:
    loop = asyncio.get_running_loop()
    now = [100.0]
    monkeypatch.setattr(loop, "time", lambda: now[0])
    closed: list[str] = []

    async def closer(session: str) -> None:
        closed.append(session)

    timers = _Timers()
    cache: ConnectionCache[str] = ConnectionCache(2.0, closer, call_later=timers.call_later)
    cache.store("k", "a")
    now[0] = 100.5
    cache.store("k", "b")
    now[0] = 101.0
    cache.store("j", "c")
    assert len(timers.armed) == 1 and len(cache) == 3  # one timer for the cache
    assert cache.take("k") == "b"  # newest first; its expiry is skipped, not cancelled
    now[0] = 102.0
    assert timers.fire() == 2.0
    assert len(cache) == 1 and "k" not in cache and cache.stats.expired == 1
    assert timers.armed[0][0] == 1.0  # re-armed for c, due at 103.0
    now[0] = 103.0
    timers.fire()
    assert len(cache) == 0 and not timers.armed
    await cache.close()
    assert sorted(closed) == ["a", "c"]
    cache.store("k", "d")  # usable again: a new timer
    assert len(timers.armed) == 1
    await cache.close()
    assert timers.armed[0][2].cancelled and closed[-1] == "d"
