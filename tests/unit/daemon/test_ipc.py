"""The notify channel's messages (``qmgrd.daemon.ipc``) and the worker count parameter."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from qmgrd.config import load_config
from qmgrd.daemon.intakeflow import FlowSettings, WorkerRegulator
from qmgrd.daemon.ipc import (
    CountingIntake,
    apply_counts,
    commit_from,
    encode,
    encode_commit,
    inflow_counts,
    parse,
)
from qmgrd.daemon.metrics_intake import IntakeMetrics
from qmgrd.daemon.workers import worker_count
from qmgrd.errors import ConfigError
from qmgrd.listener.observer import Committed
from tests.support.config import write_config


@pytest.mark.parametrize("sasl", [None, "alice"])
def test_a_commit_crosses_the_channel_whole(sasl: str | None) -> None:
    """Queue id, sender, client address, SASL user and recipient count come back as sent,
    on one line."""
    c = Committed("4A0C1922FA60", 'o"dd\\sender@\u00e9xample.com', "2001:db8::1", sasl, 3)
    line = encode_commit(c)
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    assert commit_from(parse(line)) == c


@pytest.mark.parametrize("sasl", [None, "b\u00f6b\x01"])
def test_a_commit_line_is_the_generic_encoders_line(sasl: str | None) -> None:
    """``encode_commit`` writes byte for byte what ``encode`` writes for the same fields
    (escapes, non-ASCII, control characters, null), so the queue manager's parse is one."""
    c = Committed("4A0C1922FA60", 'q"\\t\ttab\u2028\U0001f600@\u00e9x', "::ffff:10.0.0.1", sasl, 12)
    assert encode_commit(c) == encode(
        "c", c.queue_id, c.sender, c.client_addr, c.sasl_user, c.recipients
    )
    assert encode("c", 1.5, True, [1], {"a": 2}) == b'["c",1.5,true,[1],{"a":2}]\n'


@pytest.mark.parametrize(
    "line",
    [
        b"{}\n", b"[]\n", b"[1]\n", b"not json\n", b'["c","id"]\n', b'["c",1,"s","a",null,1]\n',
        b'["c","\xff"]\n', b"\n",
    ],
)
def test_a_malformed_line_is_a_value_error(line: bytes) -> None:
    """What a worker could never send is refused (the queue manager logs and drops it)."""
    with pytest.raises(ValueError):
        commit_from(parse(line))


async def test_intake_counts_are_summed_into_the_queue_managers_series() -> None:
    """A worker's events, flushed as counts, land in the Prometheus series as if counted
    in process; the session gauge is the worker's current count."""
    sent: list[bytes] = []
    counting = CountingIntake(sent.append)
    counting.connected()
    counting.session_started()
    counting.replied("554 5.7.1 <x@y>: Relay access denied")
    counting.replied("250 2.0.0 Ok")
    counting.message_accepted(2)
    counting.auth_failed("plain")
    counting.rejected("limits")
    await asyncio.sleep(0.1)  # the flush timer (FLUSH_DELAY) runs on the loop
    assert len(sent) == 1
    registry = CollectorRegistry(auto_describe=False)
    intake = IntakeMetrics(registry)
    fields = parse(sent[0])
    apply_counts(intake, fields[1])
    assert fields[2] == 1

    def value(name: str, **labels: str) -> float:
        return registry.get_sample_value(name, labels) or 0.0

    assert value("qmgrd_smtpd_connections_total") == 1
    assert value("qmgrd_smtpd_messages_total") == 1
    assert value("qmgrd_smtpd_recipients_total") == 2
    assert value("qmgrd_smtpd_rejects_total", reason="relay_denied") == 1
    assert value("qmgrd_smtpd_rejects_total", reason="limits") == 1
    assert value("qmgrd_smtpd_auth_failures_total", mechanism="PLAIN") == 1
    counting.session_ended()
    counting.flush()
    assert parse(sent[1]) == ["s", {}, 0]


@pytest.mark.parametrize(
    ("value", "expected"), [("0", 0), ("1", 1), ("3", 3), ("auto", None), (" 2 ", 2)]
)
def test_worker_count(tmp_path: Path, value: str, expected: int | None) -> None:
    """smtpd_worker_processes: a number, or auto = the CPU count."""
    cfg = load_config(write_config(tmp_path, f"smtpd_worker_processes = {value}\n"))
    assert worker_count(cfg) == (expected if expected is not None else os.cpu_count() or 1)


@pytest.mark.parametrize("value", ["many", "-1", "1000"])
def test_a_bad_worker_count_is_a_config_error(tmp_path: Path, value: str) -> None:
    """Anything else names the parameter."""
    cfg = load_config(write_config(tmp_path, f"smtpd_worker_processes = {value}\n"))
    with pytest.raises(ConfigError, match="smtpd_worker_processes"):
        worker_count(cfg)


async def test_a_workers_gate_counters_ride_with_its_intake_counts() -> None:
    """The worker's in_flow_delay pauses, timeouts and 421 refusals are sent as deltas
    (``inflow:`` counts) and read back by name; nothing is sent twice."""
    sent: list[bytes] = []
    counting = CountingIntake(sent.append)
    read_fd, write_fd = os.pipe()
    try:
        regulator = WorkerRegulator(read_fd, FlowSettings(in_flow_delay=0.01))
        counting.gate = regulator.gate
        regulator.over_backlog = True  # the queue manager said so
        assert not regulator.gate.admit_session()
        regulator.over_backlog = False
        assert await regulator.gate.admit_message()  # no token: waits, times out, goes on
        counting.flush()
        assert inflow_counts(parse(sent[-1])[1]) == {"paused": 1, "timeout": 1, "refused": 1}
        os.write(write_fd, b"t")
        assert await regulator.gate.admit_message()  # a token: no pause
        counting.flush()
        assert inflow_counts(parse(sent[-1])[1]) == {}
        regulator.stop()
    finally:
        os.close(read_fd)
        os.close(write_fd)
