"""The queue manager's anvil (per-client counts over every listener worker) and its client."""

from __future__ import annotations

import asyncio

import pytest
from structlog.testing import capture_logs

from qmgrd.daemon.anvil import Anvil, AnvilClient
from qmgrd.daemon.ipc import encode, parse


def test_counts_sessions_of_every_worker_and_forgets_a_lost_one() -> None:
    anvil = Anvil()
    assert anvil.connect(1, "192.0.2.1") == 1
    assert anvil.connect(2, "192.0.2.1") == 2  # another worker, same client: one count
    assert anvil.connect(2, "192.0.2.9") == 1
    anvil.disconnect(1, "192.0.2.1")
    assert anvil.counters.sessions("192.0.2.1") == 1
    anvil.lost(2)  # worker 2 died: its sessions are gone
    assert anvil.counters.sessions("192.0.2.1") == 0
    assert anvil.counters.total == 0
    anvil.disconnect(2, "192.0.2.9")  # a late disconnect of the lost worker: ignored
    assert anvil.counters.total == 0


def test_auth_rate_is_counted_in_windows_over_every_worker() -> None:
    now = [100.0]
    anvil = Anvil(clock=lambda: now[0])
    answers = [
        parse(anvil.message(slot, ["anvil", n, "auth", "192.0.2.1", 60]) or b"")
        for n, slot in enumerate((1, 2, 1), start=1)
    ]
    assert answers == [["anvil", 1, 1], ["anvil", 2, 2], ["anvil", 3, 3]]
    now[0] += 60
    assert anvil.message(2, ["anvil", 4, "auth", "192.0.2.1", 60]) == encode("anvil", 4, 1)


def test_messages_connect_disconnect_and_malformed() -> None:
    anvil = Anvil()
    assert anvil.message(1, ["anvil", 7, "connect", "192.0.2.1"]) == encode("anvil", 7, 1)
    assert anvil.message(1, ["anvil", 0, "disconnect", "192.0.2.1"]) is None
    assert anvil.counters.total == 0
    for bad in (["anvil", 1, "connect"], ["anvil", 1, "frob", "x"], ["anvil", 1, "auth", "x"]):
        with pytest.raises(ValueError):
            anvil.message(1, bad)


async def test_client_gets_the_queue_managers_count() -> None:
    """Requests go out as messages; the answer with the same id is the result."""
    anvil = Anvil()
    client: AnvilClient

    def send(data: bytes) -> None:  # the queue manager answers on the next loop turn
        answer = anvil.message(1, parse(data))
        if answer is not None:
            asyncio.get_running_loop().call_soon(client.answer, parse(answer))

    client = AnvilClient(send)
    anvil.connect(2, "192.0.2.1")  # a session on another worker
    assert await client.connect("192.0.2.1") == 2
    client.disconnect("192.0.2.1")
    assert anvil.counters.sessions("192.0.2.1") == 1
    assert await client.auth_event("192.0.2.1", 60.0) == 1


async def test_client_falls_back_when_unanswered_logged_once_until_answers_resume() -> None:
    """No answer within the wait: None (the listener uses its own count), one warning; then
    no waiting at all until an answer arrives again (logged), requests still sent."""
    sent: list[list[object]] = []
    client = AnvilClient(lambda data: sent.append(parse(data)), wait=0)
    with capture_logs() as logs:
        assert await client.connect("192.0.2.1") is None
        assert client.degraded
        assert await client.connect("192.0.2.1") is None  # not waited for
        assert await client.auth_event("192.0.2.1", 60.0) is None
        client.answer(["anvil", 1, 1])  # late answers: the queue manager is back
        assert not client.degraded
        client.answer(["anvil", 2, 2])
    assert [m[2] for m in sent] == ["connect", "connect", "auth"]
    warnings = [e for e in logs if e["log_level"] == "warning"]
    assert len(warnings) == 1 and "did not answer" in warnings[0]["event"]
    assert [e["event"] for e in logs if e["log_level"] == "info"] == [
        "anvil: the queue manager answers again"
    ]
    with pytest.raises(ValueError):
        client.answer(["anvil", "x", 1])


async def test_an_outage_is_logged_at_most_once_a_minute() -> None:
    """Answers that keep missing the wait (a queue manager hovering around it) log one line
    a minute, not one per outage; an outage not logged ends silently."""
    now = [0.0]
    client = AnvilClient(lambda data: None, wait=0, clock=lambda: now[0])
    with capture_logs() as logs:
        for n in range(1, 6):  # five outages in 50 s
            assert await client.connect("192.0.2.1") is None
            client.answer(["anvil", n, 1])
            now[0] += 10
        now[0] += 10  # 60 s after the first line
        assert await client.connect("192.0.2.1") is None
    assert [e["log_level"] for e in logs] == ["warning", "info", "warning"]
