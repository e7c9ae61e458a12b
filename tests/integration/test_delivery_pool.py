"""The queue manager's side of delivery workers (``DeliveryPool``) against scripted workers.

The workers here are a short Python script speaking the channel (``qmgrd.daemon.dwire``):
it answers a request by its queue id: ``hang`` never, ``die`` by exiting, ``bug`` with an
internal error, anything else with every recipient sent. Real processes and sockets, no
SMTP: what is pinned is the containment of a worker that hangs, dies or has a bug.
"""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from qmgrd.daemon.dpool import DeliveryPool, DeliveryWorkerError, RemoteAgent
from qmgrd.delivery.agent import DeliveryRequest, Outcome, Recipient
from qmgrd.errors import InvariantError
from qmgrd.spool import QueueFileContent
from tests.support.waits import wait_until

WORKER = r"""
import json, os, socket, sys
sock = socket.socket(fileno=int(sys.argv[1]))
out = sock.makefile("wb", buffering=0)
out.write(b'["ready"]\n')
for line in sock.makefile("rb"):
    fields = json.loads(line)
    if fields[0] != "d":
        continue
    n, qid, rcpts = fields[1], fields[2], fields[12]
    if qid == "die":
        os._exit(3)
    if qid == "bug":
        out.write(json.dumps(["x", n, "internal error: InvariantError('x')"]).encode() + b"\n")
    elif qid != "hang":
        rows = [[i, "s", "2.0.0", "250 ok", "sink"] for i in range(len(rcpts))]
        out.write(json.dumps(["r", n, rows, None, None, 0.1, 0.2, {}, None]).encode() + b"\n")
"""


class ScriptedPool(DeliveryPool):
    """A pool whose workers run ``WORKER``."""

    script = Path()

    def command(self, slot: int, channel: int) -> tuple[list[str], list[int]]:
        return [sys.executable, str(self.script), str(channel)], [channel]


def _request(queue_id: str) -> DeliveryRequest:
    return DeliveryRequest(
        queue_id=queue_id,
        transport="smtp",
        nexthop="[127.0.0.1]:25",
        sender="s@example.com",
        recipients=(Recipient("a@example.org", 10), Recipient("b@example.org", 40)),
        content=QueueFileContent(Path("/nonexistent"), 0, 10),
    )


@pytest.fixture
async def pool(tmp_path: Path) -> AsyncIterator[ScriptedPool]:
    ScriptedPool.script = tmp_path / "worker.py"
    ScriptedPool.script.write_text(WORKER)
    pool = ScriptedPool(tmp_path, 1)
    await pool.start()
    try:
        yield pool
    finally:
        await pool.stop()


async def test_a_result_comes_back_for_the_requests_recipients(pool: ScriptedPool) -> None:
    """The worker's answer becomes the DeliveryResult of the request's own recipients."""
    request = _request("ok")
    result = await RemoteAgent(pool, lambda _r: 30.0).deliver(request)
    assert [(r.recipient, r.outcome) for r in result.recipients] == [
        (request.recipients[0], Outcome.SENT),
        (request.recipients[1], Outcome.SENT),
    ]
    assert result.conn_setup_time == 0.1


async def test_a_silent_worker_is_killed_after_the_bound_and_restarted(
    pool: ScriptedPool,
) -> None:
    """No answer within the bound: DeliveryWorkerError, the worker killed (logged) and
    started again, which then delivers."""
    [first] = pool.pids
    with capture_logs() as logs, pytest.raises(DeliveryWorkerError, match="in time"):
        await pool.deliver(_request("hang"), 0.3)
    assert any("gave no result in 0s: killed" in e["event"] for e in logs)
    await wait_until(lambda: pool.pids not in ([], [first]), "a new worker")
    result = await pool.deliver(_request("ok"), 30.0)
    assert len(result.recipients) == 2


async def test_a_worker_that_dies_fails_its_deliveries_and_is_restarted(
    pool: ScriptedPool,
) -> None:
    """The worker exits with a delivery in flight: that delivery raises DeliveryWorkerError
    (the dispatcher's crash result), the exit is logged as Postfix's master does, and the
    next delivery waits for the new worker."""
    [first] = pool.pids
    with capture_logs() as logs, pytest.raises(DeliveryWorkerError, match="ended"):
        await pool.deliver(_request("die"), 30.0)
    result = await pool.deliver(_request("ok"), 30.0)  # waits for the restarted worker
    assert len(result.recipients) == 2 and pool.pids != [first]
    assert any(
        e["event"] == f"process qmgrd/delivery pid {first} exit status 3; restarting it"
        for e in logs
    )


async def test_an_internal_error_in_the_worker_is_an_invariant_error_here(
    pool: ScriptedPool,
) -> None:
    """A bug in the worker's agent stops the daemon as one in process does."""
    with pytest.raises(InvariantError, match="in the delivery process"):
        await pool.deliver(_request("bug"), 30.0)
