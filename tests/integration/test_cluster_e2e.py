"""Three qmgrd nodes sharing a real redis-server: concurrency, learning, dead destinations,
rate limits, and Redis going away (issue 16; docs/cluster.md)."""

from __future__ import annotations

import asyncio
import bisect
from collections.abc import Iterator
from pathlib import Path

import pytest
import structlog.testing

from tests.integration.cluster import Cluster, cluster_config, delivered, queue_mail
from tests.integration.sinks import SinkConfig, SinkServer, smtp_sink
from tests.support.process import DaemonProcess
from tests.support.redisserver import RedisServer, redis_server
from tests.support.waits import wait_until

PER_NODE = 100
SERVER_LIMIT = 5
ISSUE_RCPTS = 1000  # per node: the issue's 3,000 recipients over three nodes
ISSUE_PER_MESSAGE = 3  # three to a message: 1,000 sessions in all


@pytest.fixture
def redis(tmp_path: Path) -> Iterator[RedisServer]:
    """The cluster's Redis."""
    with redis_server(tmp_path / "redis") as server:
        yield server


async def run_three(
    root: Path,
    sink: SinkServer,
    backend: str,
    extra: str,
    per_node: int = PER_NODE,
    per_message: int = 1,
) -> Cluster:
    """Queue ``per_node`` recipients (``per_message`` to a message) on each of three nodes,
    run them until idle, stop."""
    confs = [cluster_config(root, i, sink, backend, extra) for i in range(3)]
    for i, conf in enumerate(confs):
        queue_mail(conf, per_node, first=i * per_node, per_message=per_message)
    cluster = Cluster(confs)
    await cluster.start()
    try:
        await cluster.wait_idle(240)
    finally:
        await cluster.stop()
    return cluster


def busy_sink() -> SinkConfig:
    """Admits 5 sessions (421 beyond); each delivery takes a while (3 x 20 ms +/- 50 %)."""
    return SinkConfig(max_sessions=SERVER_LIMIT, delay=0.02, delay_jitter=0.01)


@pytest.mark.slow
async def test_shared_leases_keep_the_cluster_within_the_destination_limit(
    tmp_path: Path, redis: RedisServer
) -> None:
    """Concurrency limit 5 over three nodes relaying 3,000 recipients (1,000 sessions): the
    sink never sees more than 5 + 1 sessions and every recipient arrives exactly once (each
    node alone would open 5: 15)."""
    extra = "default_destination_concurrency_limit = 5\n"
    total = 3 * ISSUE_RCPTS
    with structlog.testing.capture_logs():
        async with smtp_sink(busy_sink()) as sink:
            cluster = await run_three(
                tmp_path, sink, redis.url, extra, ISSUE_RCPTS, ISSUE_PER_MESSAGE
            )
    got = delivered(sink)
    deferred = cluster.stat("recipients_deferred")
    print(f"\ncap 5: sink peak {sink.peak}, deferred {deferred}/{total}, {sink.refused} refused")
    assert sink.peak <= SERVER_LIMIT + 1
    assert max(got.values()) == 1
    assert cluster.stat("recipients_sent") + deferred == total
    assert deferred <= 0.02 * total
    assert all(cluster.gate(i).state.shared for i in range(3))


@pytest.mark.slow
async def test_without_shared_state_the_nodes_overrun_the_destination(tmp_path: Path) -> None:
    """The same run with the local backend: each node keeps its own window and together they
    open more sessions than the destination admits (what the shared leases prevent)."""
    extra = "default_destination_concurrency_limit = 5\n"
    with structlog.testing.capture_logs():
        async with smtp_sink(busy_sink()) as sink:
            await run_three(tmp_path, sink, "local", extra, per_node=40)
    assert sink.peak > SERVER_LIMIT + 1


@pytest.mark.slow
async def test_learned_limit_is_shared_and_defers_at_most_two_percent(
    tmp_path: Path, redis: RedisServer
) -> None:
    """Client limit 20, initial window 5, learning on, 3,000 recipients (1,000 sessions): the
    nodes share one window (5, not 5 each), grown by positive feedback until the sink's 421
    teaches the cluster its limit (published in Redis): the sink's peak stays <= 5 + 1 and
    at most 2 % of the recipients are deferred."""
    extra = "default_destination_concurrency_learning = yes\n"
    total = 3 * ISSUE_RCPTS
    with structlog.testing.capture_logs():
        async with smtp_sink(busy_sink()) as sink:
            cluster = await run_three(
                tmp_path, sink, redis.url, extra, ISSUE_RCPTS, ISSUE_PER_MESSAGE
            )
    deferred = cluster.stat("recipients_deferred")
    learned = sum(cluster.gate(i).learned for i in range(3))
    trips = sum(cluster.gate(i).state.status()["round_trips"] for i in range(3))
    print(
        f"\nlearning: sink peak {sink.peak}, deferred {deferred}/{total}, "
        f"{sink.refused} refused, {learned} learned, {trips} Redis round trips"
    )
    assert sink.peak <= SERVER_LIMIT + 1
    assert cluster.stat("recipients_sent") + cluster.stat("recipients_deferred") == total
    assert cluster.stat("recipients_deferred") <= 0.02 * total
    assert sum(cluster.gate(i).learned for i in range(3)) >= 1
    assert max(delivered(sink).values()) == 1


def health_keys(server: RedisServer) -> list[str]:
    """The destinations Redis holds a dead verdict for."""
    import redis as sync_redis

    client = sync_redis.Redis.from_url(server.url, decode_responses=True)
    try:
        return [str(k) for k in client.keys("*:health")]
    finally:
        client.close()


@pytest.mark.slow
async def test_dead_destination_is_skipped_by_all_and_one_node_probes(
    tmp_path: Path, redis: RedisServer
) -> None:
    """One node finds the destination dead: the others defer their mail for it within a
    second without connecting; after the revival time exactly one node connects (the probe)
    while the others wait, and once it succeeds everybody delivers."""
    extra = (
        "initial_destination_concurrency = 1\n"
        "default_destination_concurrency_failed_cohort_limit = 1\n"
        "default_destination_concurrency_learning = no\n"
        "minimal_backoff_time = 2s\n"
        "maximal_backoff_time = 2s\n"
        "queue_run_delay = 3600s\n"
    )
    loop = asyncio.get_running_loop()
    config = SinkConfig(greeting="421 4.3.2 down for maintenance")
    with structlog.testing.capture_logs():
        async with smtp_sink(config) as sink:
            confs = [cluster_config(tmp_path, i, sink, redis.url, extra) for i in range(3)]
            cluster = Cluster(confs)
            await cluster.start()
            try:
                a, b, c = cluster.nodes
                a.enqueue("s@src.test", ["r0@dst.test"])
                await wait_until(lambda: bool(health_keys(redis)), "a shared dead verdict", 10)
                dead_at = loop.time()
                for i in range(5):
                    b.enqueue("s@src.test", [f"b{i}@dst.test"])
                    c.enqueue("s@src.test", [f"c{i}@dst.test"])
                await wait_until(
                    lambda: cluster.gate(1).held >= 1 and cluster.gate(2).held >= 1,
                    "b and c to take the shared verdict",
                    5,
                )
                assert loop.time() - dead_at <= 1.0  # they stopped trying within a second
                await wait_until(
                    lambda: b.engine.stats.recipients_deferred == 5
                    and c.engine.stats.recipients_deferred == 5,
                    "b and c to defer",
                    10,
                )
                assert sink.connections == 1  # node a's attempt only
                # Revival: the destination answers again but holds the first session at the
                # greeting, so the probe is still running when the others look.
                config.greeting = None
                config.stall = frozenset({"greeting"})
                await wait_until(lambda: loop.time() >= dead_at + 2.1, "the revival time", 5)
                for node in cluster.nodes:
                    node.engine.flush()
                await sink.wait_stalled("greeting")
                await wait_until(
                    lambda: sum(cluster.gate(i).postponed > 0 for i in range(3)) >= 2,
                    "the other nodes to wait for the probe",
                    10,
                )
                assert sink.connections == 2  # a's first attempt and the one probe
                sink.release()
                await sink.wait_messages(11, timeout=30)
                await cluster.wait_idle(30)
            finally:
                await cluster.stop()
    assert sorted(delivered(sink)) == sorted(
        ["r0@dst.test"] + [f"{n}{i}@dst.test" for n in "bc" for i in range(5)]
    )
    assert max(delivered(sink).values()) == 1


@pytest.mark.slow
async def test_shared_rate_limit_holds_over_two_periods(tmp_path: Path, redis: RedisServer) -> None:
    """The issue's 600 messages a minute over three nodes for two minutes, the period
    shortened to 10 s: ``600/10s,max_burst=10``, 1,200 messages (400 a node). No 10-second
    window of the sink's arrivals (one starting at each arrival) holds more than 600 + 5 %,
    and the whole run is no faster than 60 a second + 5 %."""
    count, period, burst, per_node = 600, 10.0, 10, 400
    extra = f"default_destination_rate_limit = {count}/{period:g}s,max_burst={burst}\n"
    with structlog.testing.capture_logs():
        async with smtp_sink(SinkConfig()) as sink:
            await run_three(tmp_path, sink, redis.url, extra, per_node=per_node)
    times = sorted(m.received_at for m in sink.messages)
    assert len(times) == 3 * per_node
    worst = _worst_window(times, period)
    span = times[-1] - times[0]
    print(
        f"\nrate {count}/{period:g}s: worst {period:g}-s window {worst}, "
        f"overall {_rate(times):.1f}/s (limit {count / period:g}/s) over {span:.1f} s"
    )
    assert worst <= count * 1.05
    assert _rate(times) <= count / period * 1.05


@pytest.mark.slow
async def test_local_rate_limit_is_per_node(tmp_path: Path) -> None:
    """``50/1s`` with ``local``: each node keeps the limit alone (each at most 50 a second,
    within 5 %), so together they deliver faster than 50 a second. (A shared limit would
    hold them to ~52.5; 1.25x leaves room for nodes that start apart on a loaded machine:
    1.5x failed once at 74.5 msg/s under a load of 15-30.)"""
    rate, per_node = 50, 50
    extra = f"default_destination_rate_limit = {rate}/1s\n"
    with structlog.testing.capture_logs():
        async with smtp_sink(SinkConfig()) as sink:
            await run_three(tmp_path, sink, "local", extra, per_node=per_node)
    times = sorted(m.received_at for m in sink.messages)
    assert len(times) == 3 * per_node
    assert _rate(times) > 1.25 * rate
    for node in range(3):
        mine = {f"r{i}@dst.test" for i in range(node * per_node, (node + 1) * per_node)}
        node_times = sorted(m.received_at for m in sink.messages if m.rcpt_tos[0] in mine)
        assert _worst_window(node_times, 1.0) <= rate * 1.05


def _worst_window(times: list[float], span: float) -> int:
    """The most arrivals in a window of ``span`` seconds starting at an arrival (sorted)."""
    return max(bisect.bisect_left(times, start + span) - i for i, start in enumerate(times))


def _rate(times: list[float]) -> float:
    """Arrivals per second from the first to the last."""
    return (len(times) - 1) / (times[-1] - times[0])


@pytest.mark.slow
async def test_redis_killed_mid_run_mail_flows_on_local_limits_and_nodes_rejoin(
    tmp_path: Path, redis: RedisServer
) -> None:
    """Redis SIGKILLed after a third of the mail and restarted after two thirds: delivery
    goes on (each node on 34 % of the limit), each node logs the fall-back once, shows it in
    its status, re-joins, and every recipient arrives exactly once. The sink's peak stays
    <= 5 + 1 throughout, re-joining included (a re-joined node keeps to its share until the
    others can have re-joined)."""
    extra = (
        "default_destination_concurrency_limit = 5\n"
        "minimal_backoff_time = 1s\n"
        "maximal_backoff_time = 1s\n"
        "queue_run_delay = 1s\n"
    )
    total = 3 * PER_NODE
    with structlog.testing.capture_logs() as logs:
        async with smtp_sink(busy_sink()) as sink:
            confs = [cluster_config(tmp_path, i, sink, redis.url, extra) for i in range(3)]
            for i, conf in enumerate(confs):
                queue_mail(conf, PER_NODE, first=i * PER_NODE)
            cluster = Cluster(confs)
            await cluster.start()
            try:
                await sink.wait_messages(total // 3, timeout=60)
                redis.kill()
                await sink.wait_messages(total // 3 + 20, timeout=60)
                status = cluster.nodes[0].engine.status()["destination_state"]
                assert status["connected"] is False
                assert sink.active <= SERVER_LIMIT
                await sink.wait_messages(2 * total // 3, timeout=60)
                redis.start()
                await wait_until(
                    lambda: all(cluster.gate(i).state.shared for i in range(3)),
                    "every node to re-join",
                    15,
                )
                await sink.wait_for(
                    lambda: len(delivered(sink)) == total, "every recipient", timeout=90
                )
                await cluster.wait_idle(30)
            finally:
                await cluster.stop()
    got = delivered(sink)
    print(f"\nredis killed: sink peak {sink.peak}, {sink.refused} refused")
    assert sink.peak <= SERVER_LIMIT + 1
    assert len(got) == total and max(got.values()) == 1
    assert sorted(got) == sorted(f"r{i}@dst.test" for i in range(total))
    fallbacks = [e for e in logs if "falling back to local limits" in str(e.get("event"))]
    rejoins = [e for e in logs if "re-joined" in str(e.get("event"))]
    assert len(fallbacks) == 3 and len(rejoins) == 3


@pytest.mark.slow
async def test_killed_node_leases_expire_and_the_others_take_over(
    tmp_path: Path, redis: RedisServer
) -> None:
    """A ``qmgrd run`` process holding all 5 leases is SIGKILLed: within the lease TTL (3 s)
    the in-process node, refused until then, gets the leases and delivers its mail."""
    extra = "default_destination_concurrency_limit = 5\n"
    ttl = 3.0
    loop = asyncio.get_running_loop()
    config = SinkConfig(stall=frozenset({"MAIL"}))
    with structlog.testing.capture_logs():
        async with smtp_sink(config) as sink:
            doomed_conf = cluster_config(tmp_path, 0, sink, redis.url, extra)
            queue_mail(doomed_conf, 10)
            doomed = DaemonProcess(doomed_conf).start()
            try:
                await asyncio.to_thread(doomed.wait_ready)
                await sink.wait_stalled("MAIL", count=5)
                conf = cluster_config(tmp_path, 1, sink, redis.url, extra)
                cluster = Cluster([conf])
                await cluster.start()
                try:
                    for i in range(5):
                        cluster.nodes[0].enqueue("s@src.test", [f"a{i}@dst.test"])
                    await wait_until(
                        lambda: cluster.gate(0).postponed > 0, "the survivor to be refused"
                    )
                    assert not sink.messages
                    killed_at = loop.time()
                    doomed.kill()
                    sink.release()
                    await sink.wait_messages(5, timeout=15)
                    await cluster.wait_idle(15)
                finally:
                    await cluster.stop()
            finally:
                doomed.close()
    first = min(m.received_at for m in sink.messages)
    # The leases were renewed at most ttl/3 before the kill: they expire 2 to 3 s after it;
    # the first message then needs one delivery more.
    assert ttl / 3 <= first - killed_at <= ttl + 1.0
    assert sorted(delivered(sink)) == [f"a{i}@dst.test" for i in range(5)]
