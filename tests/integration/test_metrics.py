"""Metrics endpoint tests: scrape over 127.0.0.1 and parse with prometheus_client's text parser."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from qmgrd.daemon.metrics import (
    Metrics,
    MetricsServer,
    reason_class,
    spool_queue_counts,
    start_metrics_server,
)
from qmgrd.daemon.snapshot import EngineStatus
from qmgrd.errors import InvariantError


def _queue(
    name: str, *, window: int = 5, busy: int = 0, todo: int = 0, state: str = "ready"
) -> dict[str, Any]:
    return {
        "name": name,
        "nexthop": name,
        "window": window,
        "busy": busy,
        "todo": todo,
        "state": state,
        "reason": "4.4.1 connection refused" if state == "dead" else None,
    }


def _status(queues: list[dict[str, Any]], *, relay_dead: bool = False) -> dict[str, Any]:
    """A snapshot in the shape of Engine.status()."""
    return {
        "uptime": 12.5,
        "messages_in_core": 7,
        "recipients_in_core": 42,
        "messages_waiting": 3,
        "stats": {"deliveries": 9, "recipients_sent": 8},
        "transports": [
            {"name": "smtp", "dead": False, "busy": 4, "reason": None, "queues": queues},
            {"name": "relay", "dead": relay_dead, "busy": 0, "reason": None, "queues": []},
        ],
    }


async def _get(port: int, request: bytes) -> tuple[int, dict[str, str], bytes]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(request)
        await writer.drain()
        data = await asyncio.wait_for(reader.read(), 10)
    finally:
        writer.close()
        await writer.wait_closed()
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    code = int(lines[0].split()[1])
    headers = {k.lower(): v.strip() for k, v in (line.split(":", 1) for line in lines[1:])}
    return code, headers, body


async def _scrape(port: int) -> dict[str, list[Sample]]:
    code, headers, body = await _get(port, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
    assert code == 200
    assert headers["content-type"].startswith("text/plain")
    assert int(headers["content-length"]) == len(body)
    return {f.name: f.samples for f in text_string_to_metric_families(body.decode())}


def _value(samples: list[Sample], name: str, **labels: str) -> float:
    found = [s.value for s in samples if s.name == name and s.labels == labels]
    assert len(found) == 1, (name, labels, samples)
    return found[0]


@pytest.fixture
async def served() -> AsyncIterator[tuple[Metrics, MetricsServer]]:
    """A Metrics object with an empty snapshot, served on 127.0.0.1 port 0."""
    metrics = Metrics(lambda: EngineStatus.from_json(_status([])), lambda: {"incoming": 0})
    server = await start_metrics_server("127.0.0.1", 0, metrics)
    try:
        yield metrics, server
    finally:
        await server.aclose()


async def test_delivery_counters_and_histograms(
    served: tuple[Metrics, MetricsServer],
) -> None:
    """Outcomes count by transport/status, deferrals and bounces by DSN class, delays observed."""
    metrics, server = served
    metrics.record_delivery("smtp", "sent", "2.0.0", 0.3)
    metrics.record_delivery("smtp", "sent", "2.0.0", 7.0)
    metrics.record_delivery("smtp", "deferred", "4.4.1", 60.0)
    metrics.record_delivery("smtp", "deferred", "4.4.2", 61.0)
    metrics.record_delivery("relay", "bounced", "5.1.1", 2.0)
    metrics.record_delivery("relay", "expired", "4.4.1", 432000.0)
    metrics.record_attempt("smtp", 0.02)
    families = await _scrape(server.port)
    deliveries = families["qmgrd_deliveries"]
    assert _value(deliveries, "qmgrd_deliveries_total", transport="smtp", status="sent") == 2
    assert _value(deliveries, "qmgrd_deliveries_total", transport="smtp", status="deferred") == 2
    assert _value(deliveries, "qmgrd_deliveries_total", transport="relay", status="expired") == 1
    deferrals = families["qmgrd_deferrals"]
    assert _value(deferrals, "qmgrd_deferrals_total", transport="smtp", reason_class="4.4.x") == 2
    bounces = families["qmgrd_bounces"]
    assert _value(bounces, "qmgrd_bounces_total", transport="relay", reason_class="5.1.x") == 1
    delay = families["qmgrd_delivery_delay_seconds"]
    sent = {"transport": "smtp", "status": "sent"}
    assert _value(delay, "qmgrd_delivery_delay_seconds_count", **sent) == 2
    assert _value(delay, "qmgrd_delivery_delay_seconds_sum", **sent) == pytest.approx(7.3)
    assert _value(delay, "qmgrd_delivery_delay_seconds_bucket", le="0.5", **sent) == 1
    assert _value(delay, "qmgrd_delivery_delay_seconds_bucket", le="10.0", **sent) == 2
    attempt = families["qmgrd_delivery_attempt_seconds"]
    assert _value(attempt, "qmgrd_delivery_attempt_seconds_count", transport="smtp") == 1


async def test_one_call_counts_a_delivery_of_several_recipients(
    served: tuple[Metrics, MetricsServer],
) -> None:
    """``count``: a delivery's recipients of one status and DSN in one call, each observed."""
    metrics, server = served
    metrics.record_delivery("smtp", "sent", "2.0.0", 0.3, 10)
    metrics.record_delivery("smtp", "deferred", "4.4.1", 60.0, 3)
    metrics.record_delivery("smtp", "bounced", "5.1.1", 2.0, 2)
    metrics.record_delivery("smtp", "sent", "2.0.0", 7.0)  # the same series, kept at hand
    families = await _scrape(server.port)
    deliveries = families["qmgrd_deliveries"]
    assert _value(deliveries, "qmgrd_deliveries_total", transport="smtp", status="sent") == 11
    assert _value(deliveries, "qmgrd_deliveries_total", transport="smtp", status="deferred") == 3
    deferrals = families["qmgrd_deferrals"]
    assert _value(deferrals, "qmgrd_deferrals_total", transport="smtp", reason_class="4.4.x") == 3
    bounces = families["qmgrd_bounces"]
    assert _value(bounces, "qmgrd_bounces_total", transport="smtp", reason_class="5.1.x") == 2
    delay = families["qmgrd_delivery_delay_seconds"]
    sent = {"transport": "smtp", "status": "sent"}
    assert _value(delay, "qmgrd_delivery_delay_seconds_count", **sent) == 11
    assert _value(delay, "qmgrd_delivery_delay_seconds_sum", **sent) == pytest.approx(10.0)
    assert _value(delay, "qmgrd_delivery_delay_seconds_bucket", le="0.5", **sent) == 10


async def test_state_gauges_from_the_engine_snapshot() -> None:
    """Uptime, core sizes, transport and destination gauges come from status_fn at scrape time."""
    snapshot = _status(
        [
            _queue("a.example", window=10, busy=3, todo=5),
            _queue("dead.example", window=0, todo=9, state="dead"),
        ],
        relay_dead=True,
    )
    metrics = Metrics(lambda: EngineStatus.from_json(snapshot))
    server = await start_metrics_server("127.0.0.1", 0, metrics)
    try:
        families = await _scrape(server.port)
        snapshot["messages_in_core"] = 8  # read again at the next scrape
        again = await _scrape(server.port)
    finally:
        await server.aclose()
    assert _value(families["qmgrd_uptime_seconds"], "qmgrd_uptime_seconds") == 12.5
    assert _value(families["qmgrd_messages_in_core"], "qmgrd_messages_in_core") == 7
    assert _value(again["qmgrd_messages_in_core"], "qmgrd_messages_in_core") == 8
    assert _value(families["qmgrd_recipients_in_core"], "qmgrd_recipients_in_core") == 42
    assert _value(families["qmgrd_messages_waiting"], "qmgrd_messages_waiting") == 3
    engine = families["qmgrd_engine_deliveries"]
    assert _value(engine, "qmgrd_engine_deliveries_total") == 9
    assert _value(families["qmgrd_transport_busy"], "qmgrd_transport_busy", transport="smtp") == 4
    dead = families["qmgrd_transport_dead"]
    assert _value(dead, "qmgrd_transport_dead", transport="relay") == 1
    assert _value(dead, "qmgrd_transport_dead", transport="smtp") == 0
    dead_dests = families["qmgrd_transport_dead_destinations"]
    assert _value(dead_dests, "qmgrd_transport_dead_destinations", transport="smtp") == 1
    a = {"transport": "smtp", "destination": "a.example"}
    assert _value(families["qmgrd_destination_window"], "qmgrd_destination_window", **a) == 10
    assert _value(families["qmgrd_destination_busy"], "qmgrd_destination_busy", **a) == 3
    assert _value(families["qmgrd_destination_todo"], "qmgrd_destination_todo", **a) == 5
    d = {"transport": "smtp", "destination": "dead.example"}
    assert _value(families["qmgrd_destination_window"], "qmgrd_destination_window", **d) == 0
    assert [s.labels for s in families["qmgrd_destination_dead"]] == [d]
    assert "qmgrd_queue_messages" not in families  # no queue_counts_fn given


async def test_only_the_busiest_destinations_get_series() -> None:
    """With 50 destinations and top_destinations=5, the 5 busiest (busy, then todo) are shown."""
    queues = [_queue(f"d{i:02d}.example", busy=i % 7, todo=i) for i in range(50)]
    queues += [_queue(f"x{i:02d}.example", window=0, todo=i, state="dead") for i in range(10)]
    metrics = Metrics(lambda: EngineStatus.from_json(_status(queues)), top_destinations=5)
    server = await start_metrics_server("127.0.0.1", 0, metrics)
    try:
        families = await _scrape(server.port)
    finally:
        await server.aclose()
    shown = [s.labels["destination"] for s in families["qmgrd_destination_busy"]]
    # busy 6 at i = 6, 13, 20, 27, 34, 41, 48; ties by todo (= i), most waiting first.
    assert shown == ["d48.example", "d41.example", "d34.example", "d27.example", "d20.example"]
    dead = [s.labels["destination"] for s in families["qmgrd_destination_dead"]]
    assert dead == ["x09.example", "x08.example", "x07.example", "x06.example", "x05.example"]
    dests = families["qmgrd_transport_destinations"]
    assert _value(dests, "qmgrd_transport_destinations", transport="smtp") == 60


async def test_queue_counts_from_the_spool(tmp_path: Path) -> None:
    """qmgrd_queue_messages counts files per spool queue, hashed subdirectories included."""
    for queue in ("incoming", "active", "hold"):
        (tmp_path / queue).mkdir()
    (tmp_path / "deferred" / "A").mkdir(parents=True)
    (tmp_path / "incoming" / "4F0000000000001").write_bytes(b"x")
    (tmp_path / "incoming" / ".tmp-writer").write_bytes(b"x")  # a writer's temporary
    (tmp_path / "deferred" / "A" / "4F0000000000002").write_bytes(b"x")
    (tmp_path / "deferred" / "A" / "4F0000000000003").write_bytes(b"x")
    counts = spool_queue_counts(tmp_path)
    assert counts == {"incoming": 1, "active": 0, "deferred": 2, "hold": 0, "corrupt": 0}
    metrics = Metrics(queue_counts_fn=lambda: spool_queue_counts(tmp_path))
    server = await start_metrics_server("127.0.0.1", 0, metrics)
    try:
        families = await _scrape(server.port)
    finally:
        await server.aclose()
    files = families["qmgrd_queue_messages"]
    assert _value(files, "qmgrd_queue_messages", queue="deferred") == 2
    assert _value(files, "qmgrd_queue_messages", queue="incoming") == 1
    # The synchronous path (generate) reads the counts itself.
    assert b'qmgrd_queue_messages{queue="deferred"} 2.0' in metrics.generate()


async def test_other_paths_and_methods(served: tuple[Metrics, MetricsServer]) -> None:
    """Unknown paths get 404, POST gets 405, HEAD gets headers only, garbage gets 400."""
    _metrics, server = served
    code, _, _ = await _get(server.port, b"GET /nothing HTTP/1.0\r\n\r\n")
    assert code == 404
    code, _, _ = await _get(server.port, b"POST /metrics HTTP/1.0\r\n\r\n")
    assert code == 405
    code, headers, body = await _get(server.port, b"HEAD /metrics?x=1 HTTP/1.0\r\n\r\n")
    assert code == 200
    assert body == b""
    assert int(headers["content-length"]) > 0
    code, _, _ = await _get(server.port, b"hello\r\n\r\n")
    assert code == 400


async def test_a_failing_snapshot_is_a_500_and_the_endpoint_survives() -> None:
    """An exception in status_fn answers 500 to that scrape only."""
    calls: list[int] = []

    def status() -> EngineStatus:
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("engine not ready")
        return EngineStatus.from_json(_status([]))

    metrics = Metrics(status)
    server = await start_metrics_server("127.0.0.1", 0, metrics)
    try:
        code, _, _ = await _get(server.port, b"GET /metrics HTTP/1.0\r\n\r\n")
        assert code == 500
        families = await _scrape(server.port)
    finally:
        await server.aclose()
    assert "qmgrd_uptime_seconds" in families


async def test_ipv6_loopback() -> None:
    """The endpoint binds ::1 when asked (metrics_listen = [::1]:port)."""
    metrics = Metrics()
    try:
        server = await start_metrics_server("::1", 0, metrics)
    except OSError as exc:  # pragma: no cover - hosts without IPv6
        pytest.skip(f"no IPv6 loopback: {exc}")
    try:
        reader, writer = await asyncio.open_connection("::1", server.port)
        writer.write(b"GET /metrics HTTP/1.0\r\n\r\n")
        data = await asyncio.wait_for(reader.read(), 10)
        writer.close()
        await writer.wait_closed()
    finally:
        await server.aclose()
    assert data.startswith(b"HTTP/1.0 200 OK\r\n")


def test_reason_class() -> None:
    """Enhanced status codes map to class.subject.x; anything else is 'other'."""
    assert reason_class("4.4.1") == "4.4.x"
    assert reason_class(" 5.7.1 ") == "5.7.x"
    assert reason_class("4.04.002") == "4.4.x"
    assert reason_class("4.9.1") == "other"  # RFC 3463 defines subjects 0..7
    assert reason_class("3.1.1") == "other"
    assert reason_class("") == "other"
    assert reason_class("4.4.1 connection refused") == "other"


def test_unknown_status_is_a_bug() -> None:
    """record_delivery rejects a status outside sent/deferred/bounced/expired."""
    with pytest.raises(InvariantError, match="unknown status"):
        Metrics().record_delivery("smtp", "delivered", "2.0.0", 1.0)


def test_registries_are_private() -> None:
    """Two Metrics objects do not share series (no global registry)."""
    first, second = Metrics(), Metrics()
    first.record_delivery("smtp", "sent", "2.0.0", 1.0)
    assert b'qmgrd_deliveries_total{status="sent",transport="smtp"} 1.0' in first.generate()
    assert b"qmgrd_deliveries_total{" not in second.generate()
