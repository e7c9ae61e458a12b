"""Several in-process qmgrd nodes sharing one Redis destination state (tests and bench).

``cluster_config(root, i, sink, redis_url, extra)`` writes node ``i``'s configuration
(its own spool under ``root/node{i}``, the same parameters as every other node, relayhost =
the sink, connection caching off so each delivery is one session, each node's fallback share
34 % as docs/cluster.md says for three nodes). ``queue_mail(conf, n, first, per_message)``
commits messages to a node's ``incoming/`` before it starts.
``Cluster`` starts the nodes on the test's loop, waits for all of them to be idle and
stops them; ``delivered()`` is every recipient the sink accepted, with repeats.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from qmgrd.daemon.destgate import DestGate
from tests.integration.e2e import InProcessDaemon, commit, offline_spool, start_daemon
from tests.integration.sinks import SinkServer
from tests.support.config import write_config

BASE = (
    "default_destination_concurrency_limit = 20\n"
    "initial_destination_concurrency = 5\n"
    "smtp_connection_cache_on_demand = no\n"
    "destination_state_lease_ttl = 3s\n"
    "destination_state_fallback_percent = 34\n"
)


def cluster_config(root: Path, index: int, sink: SinkServer, backend: str, extra: str = "") -> Path:
    """Node ``index``'s configuration directory (module doc)."""
    return write_config(
        root / f"node{index}",
        f"relayhost = {sink.nexthop}\n{BASE}destination_state_backend = {backend}\n{extra}",
    )


def queue_mail(conf: Path, count: int, first: int = 0, per_message: int = 1) -> list[str]:
    """Commit ``count`` recipients r{first}@dst.test ... in the node's ``incoming/``,
    ``per_message`` to a message (one delivery each)."""
    spool = offline_spool(conf)
    now = time.time()
    rcpts = [f"r{i}@dst.test" for i in range(first, first + count)]
    for at in range(0, count, per_message):
        commit(spool, "s@src.test", rcpts[at : at + per_message], arrival_time=now)
    return rcpts


@dataclass(slots=True, eq=False)
class Cluster:
    """Running nodes (module doc)."""

    confs: list[Path]
    nodes: list[InProcessDaemon] = field(default_factory=list)

    async def start(self) -> None:
        """Start every node (no SMTP listener: mail was queued before)."""
        for conf in self.confs:
            self.nodes.append(await start_daemon(conf, listen=False))

    def gate(self, index: int) -> DestGate:
        """Node ``index``'s destination gate."""
        gate = self.nodes[index].engine.ctx.gate
        assert gate is not None
        return gate

    async def wait_idle(self, timeout: float) -> None:
        """Every node idle (bounded)."""
        await asyncio.gather(*(node.wait_idle(timeout) for node in self.nodes))

    async def stop(self) -> None:
        """Stop every node."""
        for node in self.nodes:
            await node.stop()

    def stat(self, name: str) -> int:
        """An engine counter summed over the nodes."""
        return sum(getattr(node.engine.stats, name) for node in self.nodes)


def delivered(sink: SinkServer) -> Counter[str]:
    """Every recipient the sink accepted, with how often."""
    return Counter(r for m in sink.messages for r in m.rcpt_tos)
