"""Connection caching: reuse for back-to-back deliveries, limits, expiry and close."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from qmgrd.delivery.agent import Outcome
from qmgrd.delivery.settings import SmtpSettings
from qmgrd.delivery.smtp import SmtpAgent
from tests.integration.sinks import make_request, smtp_sink
from tests.support.clock import FakeClock


@dataclass
class FakeTimers:
    """A stand-in for loop.call_later whose timers fire only when the test says so."""

    pending: list[tuple[float, Callable[[], None], FakeHandle]] = field(default_factory=list)

    def call_later(self, delay: float, callback: Callable[[], None]) -> FakeHandle:
        handle = FakeHandle()
        self.pending.append((delay, callback, handle))
        return handle

    def fire_all(self) -> int:
        fired = 0
        for _delay, callback, handle in list(self.pending):
            if not handle.cancelled:
                callback()
                fired += 1
        self.pending.clear()
        return fired


@dataclass
class FakeHandle:
    """A timer handle that remembers cancellation."""

    cancelled: bool = False

    def cancel(self) -> None:
        self.cancelled = True


def _settings(**kwargs: Any) -> SmtpSettings:
    return SmtpSettings(helo_name="client.test", connect_timeout=5, helo_timeout=5, **kwargs)


async def test_back_to_back_deliveries_reuse_one_session() -> None:
    """Twenty deliveries with LOAD|STORE use one connection, probed with RSET before each reuse."""
    async with smtp_sink() as sink:
        agent = SmtpAgent(_settings())
        for i in range(20):
            result = await agent.deliver(
                make_request(sink.nexthop, [f"r{i}@x.test"], cache_load=True, cache_store=True)
            )
            assert result.recipients[0].outcome is Outcome.SENT
        await agent.close()
        # QUIT is not answered before the close (smtp_skip_quit_response): the sink sees it later
        await sink.wait_for(lambda: "QUIT" in sink.commands, "the QUIT of close()")
    assert sink.connections == 1
    assert agent.stats.reused == 19
    assert sink.commands.count("RSET") == 19
    assert sink.commands[-1] == "QUIT"  # close() ends the cached session politely
    assert len(sink.messages) == 20


async def test_no_caching_without_flags() -> None:
    """Without the qmgr's LOAD/STORE flags each delivery opens and QUITs its own session."""
    async with smtp_sink() as sink:
        agent = SmtpAgent(_settings())
        for i in range(5):
            await agent.deliver(make_request(sink.nexthop, [f"r{i}@x.test"]))
        await agent.close()
        await sink.wait_for(lambda: sink.commands.count("QUIT") == 5, "five QUITs")
    assert sink.connections == 5
    assert len(agent.cache) == 0


async def test_cache_destinations_always_cached() -> None:
    """A destination listed in smtp_connection_cache_destinations is cached without flags."""
    async with smtp_sink() as sink:
        agent = SmtpAgent(_settings(connection_cache_destinations=(sink.nexthop,)))
        for i in range(4):
            await agent.deliver(make_request(sink.nexthop, [f"r{i}@x.test"]))
        await agent.close()
    assert sink.connections == 1


async def test_reuse_count_limit() -> None:
    """smtp_connection_reuse_count_limit = 2 ends a session after it was used three times."""
    async with smtp_sink() as sink:
        agent = SmtpAgent(_settings(connection_reuse_count_limit=2))
        for i in range(6):
            await agent.deliver(
                make_request(sink.nexthop, [f"r{i}@x.test"], cache_load=True, cache_store=True)
            )
        await agent.close()
    assert sink.connections == 2


async def test_reuse_time_limit() -> None:
    """A session older than smtp_connection_reuse_time_limit is closed, not cached."""
    clock = FakeClock()
    async with smtp_sink() as sink:
        agent = SmtpAgent(_settings(connection_reuse_time_limit=300), clock=clock)
        flags: dict[str, Any] = {"cache_load": True, "cache_store": True}
        await agent.deliver(make_request(sink.nexthop, ["a@x.test"], **flags))
        await agent.deliver(make_request(sink.nexthop, ["b@x.test"], **flags))
        clock.advance(301)
        await agent.deliver(make_request(sink.nexthop, ["c@x.test"], **flags))
        await agent.deliver(make_request(sink.nexthop, ["d@x.test"], **flags))
        await agent.close()
    assert sink.connections == 2


async def test_idle_session_expires_with_quit() -> None:
    """An idle cached session is QUIT when its cache time limit passes (timer, no polling)."""
    timers = FakeTimers()
    async with smtp_sink() as sink:
        agent = SmtpAgent(_settings(), call_later=timers.call_later)
        await agent.deliver(
            make_request(sink.nexthop, ["a@x.test"], cache_load=True, cache_store=True)
        )
        assert len(agent.cache) == 1
        assert timers.fire_all() == 1
        assert len(agent.cache) == 0
        await sink.wait_for(lambda: "QUIT" in sink.commands, "the background QUIT")
        await agent.deliver(
            make_request(sink.nexthop, ["b@x.test"], cache_load=True, cache_store=True)
        )
        await agent.close()
    assert sink.commands.count("QUIT") == 2
    assert sink.connections == 2
    assert agent.cache.stats.expired == 1


async def test_dead_cached_session_is_replaced() -> None:
    """A cached session the server closed fails its RSET probe and a new connection is used."""
    async with smtp_sink() as sink:
        agent = SmtpAgent(_settings())
        flags: dict[str, Any] = {"cache_load": True, "cache_store": True}
        await agent.deliver(make_request(sink.nexthop, ["a@x.test"], **flags))
        for protocol in list(sink._protocols):  # the server drops idle connections
            assert protocol.transport is not None
            protocol.transport.close()
        await sink.wait_for(lambda: sink.active == 0, "the server to drop its connections")
        result = await agent.deliver(make_request(sink.nexthop, ["b@x.test"], **flags))
        await agent.close()
    assert result.recipients[0].outcome is Outcome.SENT
    assert result.hop is None
    assert sink.connections == 2


async def test_concurrent_deliveries_share_the_cache() -> None:
    """Concurrent deliveries open at most one session each, then later ones reuse them."""
    async with smtp_sink() as sink:
        agent = SmtpAgent(_settings())
        flags: dict[str, Any] = {"cache_load": True, "cache_store": True}
        for batch in range(4):
            results = await asyncio.gather(
                *(
                    agent.deliver(make_request(sink.nexthop, [f"r{batch}-{i}@x.test"], **flags))
                    for i in range(5)
                )
            )
            assert all(r.recipients[0].outcome is Outcome.SENT for r in results)
        await agent.close()
    assert sink.connections == 5
    assert len(sink.messages) == 20
