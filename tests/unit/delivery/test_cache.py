"""ConnectionCache: sessions stored, taken and expired on the running loop, loop after loop."""

from __future__ import annotations

import asyncio

from qmgrd.delivery.cache import ConnectionCache
from tests.support.waits import TIMEOUT


def test_the_cache_expires_sessions_on_each_loop_it_is_used_on() -> None:
    """The loop is looked up once, not at every store: a cache used again on a new loop
    (the first one closed) times its sessions out on the new one."""
    closed: list[str] = []
    expired = asyncio.Event()

    async def closer(session: str) -> None:
        closed.append(session)
        expired.set()

    cache: ConnectionCache[str] = ConnectionCache(ttl=3600.0, closer=closer)

    async def first() -> None:
        cache.store("k", "one")
        assert cache.take("k") == "one"  # its timer cancelled: nothing expires later
        cache.store("k", "two")
        await cache.close()

    async def second() -> None:
        nonlocal expired
        expired = asyncio.Event()
        cache.ttl = 0.0  # due at once, on this loop
        cache.store("k", "three")
        await asyncio.wait_for(expired.wait(), TIMEOUT)
        assert "k" not in cache

    asyncio.run(first())
    asyncio.run(second())
    assert closed == ["two", "three"]
    assert (cache.stats.stored, cache.stats.taken, cache.stats.expired) == (3, 1, 1)
