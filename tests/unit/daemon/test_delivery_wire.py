"""The delivery channel's lines (``qmgrd.daemon.dwire``) and the choice of a delivery worker."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from qmgrd.config import load_config
from qmgrd.daemon.assemble import create_agents
from qmgrd.daemon.dpool import SPILL, DeliveryPool, RemoteAgent, remote_agents, request_bound
from qmgrd.daemon.dwire import decode_request, decode_result, encode_request, encode_result
from qmgrd.daemon.ipc import parse
from qmgrd.daemon.supervise import Child
from qmgrd.delivery.agent import (
    DeliveryRequest,
    DeliveryResult,
    HopStatus,
    Outcome,
    Recipient,
    RecipientResult,
)
from qmgrd.delivery.settings import SmtpSettings
from qmgrd.spool import QueueFileContent
from tests.support.config import write_config

CONTENT = QueueFileContent(Path("/spool/active/4A0C1922FA60"), 412, 70_000)
REQUEST = DeliveryRequest(
    queue_id="4A0C1922FA60",
    transport="relay",
    nexthop="[127.0.0.1]:2525",
    sender='o"dd\\sender@example.com',
    recipients=(
        Recipient("a@example.org", 120),
        Recipient("b@example.org", 160, "rfc822;B@example.org", frozenset({"SUCCESS", "DELAY"})),
        Recipient("ü@example.org", 200, None, frozenset({"NEVER"})),
    ),
    content=CONTENT,
    smtputf8=True,
    body_8bitmime=False,
    envid="env 1",
    ret="HDRS",
    cache_load=True,
    cache_store=False,
)


def test_a_request_crosses_the_channel_whole_on_one_line() -> None:
    """Every field of the request, the content's file range included, comes back as sent."""
    line = encode_request(7, REQUEST, CONTENT)
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    n, request = decode_request(parse(line))
    assert n == 7 and request == REQUEST
    assert isinstance(request.content, QueueFileContent) and request.content.size == 70_000


def test_a_result_comes_back_on_the_requests_own_recipients() -> None:
    """Outcomes, hop status, throttle, times and notes survive; each result names the very
    Recipient object of the request (the dispatcher matches them by identity)."""
    r = REQUEST.recipients
    result = DeliveryResult(
        (
            RecipientResult(r[2], Outcome.BOUNCED, "5.1.1", "550 5.1.1 no", "mx[192.0.2.1]:25"),
            RecipientResult(r[0], Outcome.SENT, "2.0.0", "250 ok", "mx[192.0.2.1]:25"),
            RecipientResult(r[1], Outcome.DEFERRED, "4.7.0", "421 busy"),
        ),
        HopStatus("4.7.0", "host busy"),
        0.25,
        1.5,
        {"cache": "hit"},
        "full",
    )
    back = decode_result(parse(encode_result(3, REQUEST, result)), r)
    assert back == result
    assert [x.recipient for x in back.recipients] == [r[2], r[0], r[1]]
    pairs = zip(back.recipients, result.recipients, strict=True)
    assert all(x.recipient is y.recipient for x, y in pairs)


@pytest.mark.parametrize(
    "rows",
    [
        [[3, "s", "2.0.0", "ok", "none"]],  # no such recipient
        [[0, "s", "2.0.0", "ok", "none"], [0, "d", "4.0.0", "again", "none"]],  # twice
        [[0, "x", "2.0.0", "ok", "none"]],  # no such outcome
    ],
)
def test_a_malformed_result_is_refused(rows: list[Any]) -> None:
    """A result naming a recipient the request does not have, twice, or an unknown outcome."""
    with pytest.raises(ValueError):
        decode_result(["r", 1, rows, None, None, 0, 0, {}, None], REQUEST.recipients)


def test_a_throttle_without_a_hop_status_is_refused() -> None:
    """The agent contract's rule holds across the channel."""
    with pytest.raises(ValueError, match="throttle"):
        decode_result(["r", 1, [], None, None, 0, 0, {}, "rate"], REQUEST.recipients)


def test_the_bound_of_a_request_is_twice_its_transports_timeouts() -> None:
    """One of each phase's timeouts plus smtp_data_xfer_timeout per 64 KiB, doubled."""
    s = SmtpSettings(
        dns_timeout=1, connect_timeout=2, helo_timeout=3, starttls_timeout=4, mail_timeout=5,
        rcpt_timeout=6, data_init_timeout=7, data_xfer_timeout=100, data_done_timeout=8,
        rset_timeout=9, quit_timeout=10,
    )  # fmt: skip
    assert request_bound(s, REQUEST) == 2 * (55 + 2 * 100)  # 70,000 bytes: two chunks


def _pool(slots: list[int]) -> DeliveryPool:
    """A pool whose workers in ``slots`` are ready (no process: only slot and pid are read)."""
    pool = DeliveryPool(Path("/etc/qmgrd"), 3)
    for slot in slots:
        proc: Any = SimpleNamespace(pid=1000 + slot)
        pool.on_ready(Child(slot, proc, proc, proc, 0.0))
    return pool


async def test_entries_of_one_nexthop_go_to_one_worker_unless_it_is_far_busier() -> None:
    """The same transport and nexthop get the same worker; a worker that is not ready is
    skipped; past SPILL more deliveries in flight than the least busy one, it spills over."""
    pool = _pool([1, 2, 3])
    keys = [f"smtp:[10.0.0.{i}]:25" for i in range(30)]
    homes = {key: await pool._choose(key) for key in keys}
    assert {key: await pool._choose(key) for key in keys} == homes
    assert len({c.slot for c in homes.values()}) == 3  # 30 nexthops over 3 workers
    key = keys[0]
    home = homes[key]
    busy: dict[int, asyncio.Future[list[Any]]] = {
        n: asyncio.get_running_loop().create_future() for n in range(SPILL)
    }
    pool._pending[home].update(busy)
    assert await pool._choose(key) is home  # SPILL more than the others: still home
    pool._pending[home][SPILL] = asyncio.get_running_loop().create_future()
    assert await pool._choose(key) is not home
    pool.on_exit(home)  # its deliveries fail; the key goes to a live worker
    assert all(f.done() and f.exception() is not None for f in busy.values())
    assert (await pool._choose(key)).slot in {1, 2, 3} - {home.slot}


def test_only_the_smtp_agents_move_to_the_workers(tmp_path: Path) -> None:
    """remote_agents: smtp and relay deliver through the pool; discard, error and retry stay
    in the queue manager, built by the same factory."""
    pool = DeliveryPool(tmp_path, 1)
    agents = remote_agents(load_config(write_config(tmp_path)), pool, create_agents)
    remote = sorted(name for name, agent in agents.items() if isinstance(agent, RemoteAgent))
    assert remote == ["relay", "smtp"]
    assert {"discard", "error", "retry"} <= set(agents) - set(remote)
