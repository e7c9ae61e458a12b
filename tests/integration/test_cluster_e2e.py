"""Three qmgrd nodes sharing a real redis-server: concurrency, learning, dead destinations,
rate limits, and Redis going away (issue 16; docs/cluster.md)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import structlog.testing

from tests.integration.cluster import Cluster, cluster_config, delivered, queue_mail
from tests.integration.sinks import SinkConfig, SinkServer, smtp_sink
from tests.support.redisserver import RedisServer, redis_server

PER_NODE = 100
SERVER_LIMIT = 5


@pytest.fixture
def redis(tmp_path: Path) -> Iterator[RedisServer]:
    """The cluster's Redis."""
    with redis_server(tmp_path / "redis") as server:
        yield server


async def run_three(
    root: Path, sink: SinkServer, backend: str, extra: str, per_node: int = PER_NODE
) -> Cluster:
    """Queue ``per_node`` recipients on each of three nodes, run them until idle, stop."""
    confs = [cluster_config(root, i, sink, backend, extra) for i in range(3)]
    for i, conf in enumerate(confs):
        queue_mail(conf, per_node, first=i * per_node)
    cluster = Cluster(confs)
    await cluster.start()
    try:
        await cluster.wait_idle(120)
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
    """Concurrency limit 5 over three nodes: the sink never sees more than 5 + 1 sessions
    and every recipient arrives exactly once (each node alone would open 5: 15)."""
    extra = "default_destination_concurrency_limit = 5\n"
    with structlog.testing.capture_logs():
        async with smtp_sink(busy_sink()) as sink:
            cluster = await run_three(tmp_path, sink, redis.url, extra)
    got = delivered(sink)
    assert sink.peak <= SERVER_LIMIT + 1
    assert max(got.values()) == 1
    assert cluster.stat("recipients_sent") + cluster.stat("recipients_deferred") == 3 * PER_NODE
    assert cluster.stat("recipients_deferred") <= 0.02 * 3 * PER_NODE
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
    """Client limit 20, learning on: the 421s teach the cluster the sink's limit (published
    in Redis), and at most 2 % of the recipients are deferred."""
    extra = "default_destination_concurrency_learning = yes\n"
    with structlog.testing.capture_logs():
        async with smtp_sink(busy_sink()) as sink:
            cluster = await run_three(tmp_path, sink, redis.url, extra)
    total = 3 * PER_NODE
    assert cluster.stat("recipients_sent") + cluster.stat("recipients_deferred") == total
    assert cluster.stat("recipients_deferred") <= 0.02 * total
    assert sum(cluster.gate(i).learned for i in range(3)) >= 1
    assert max(delivered(sink).values()) == 1
