"""Intake metrics: the listener reports sessions, messages, rejects and AUTH failures."""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import ipaddress
from pathlib import Path

from prometheus_client import CollectorRegistry

from qmgrd.daemon.metrics_intake import IntakeMetrics
from qmgrd.listener import start_listener
from qmgrd.listener.auth import hash_password, parse_password_file
from qmgrd.spool import Spool
from tests.support.listener import Listening, loopback_settings

TIMEOUT = 20.0


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def _value(registry: CollectorRegistry, name: str, **labels: str) -> float:
    value = registry.get_sample_value(name, labels)
    return 0.0 if value is None else value


async def test_a_session_is_counted_by_outcome(tmp_path: Path) -> None:
    """One session with a relay denial, a failed then a good AUTH, a queued message with two
    recipients and a bad command: each lands in its series, and the session gauge returns to 0."""
    registry = CollectorRegistry(auto_describe=False)
    intake = IntakeMetrics(registry)
    creds = parse_password_file(f"alice:{hash_password('pw', iterations=1000)}\n", "test")
    settings = dataclasses.replace(
        loopback_settings(mynetworks=(ipaddress.ip_network("192.0.2.0/24"),)),
        sasl_credentials=creds,
    )
    spool = Spool(tmp_path / "spool", fsync=False)
    spool.ensure_dirs()
    commits: list[str] = []
    handle = await start_listener(
        settings, spool, on_commit=lambda c: commits.append(c.queue_id), observer=intake
    )
    srv = Listening(handle, spool, commits)
    try:
        chat = await srv.chat()
        await chat.cmd("EHLO client.test")
        assert _value(registry, "qmgrd_smtpd_sessions") == 1
        assert (await chat.cmd("MAIL FROM:<s@src.test>")).startswith("250")
        assert (await chat.cmd("RCPT TO:<r@dst.test>")).startswith("554 5.7.1")
        assert (await chat.cmd("RSET")).startswith("250")
        assert (await chat.cmd("AUTH PLAIN " + _b64("\0alice\0wrong"))).startswith("535")
        assert (await chat.cmd("AUTH PLAIN " + _b64("\0alice\0pw"))).startswith("235")
        assert (await chat.cmd("MAIL FROM:<s@src.test>")).startswith("250")
        assert (await chat.cmd("RCPT TO:<r1@dst.test>")).startswith("250")
        assert (await chat.cmd("RCPT TO:<r2@dst.test>")).startswith("250")
        assert (await chat.cmd("DATA")).startswith("354")
        assert (await chat.cmd("Subject: x\r\n\r\nhi\r\n.")).startswith("250 2.0.0 Ok: queued")
        assert (await chat.cmd("MAIL FROM:<bad address>")).startswith("501")
        await chat.cmd("QUIT")
    finally:
        await asyncio.wait_for(srv.close(), TIMEOUT)
    assert _value(registry, "qmgrd_smtpd_connections_total") == 1
    assert _value(registry, "qmgrd_smtpd_sessions") == 0
    assert _value(registry, "qmgrd_smtpd_messages_total") == 1
    assert _value(registry, "qmgrd_smtpd_recipients_total") == 2
    assert _value(registry, "qmgrd_smtpd_rejects_total", reason="relay_denied") == 1
    assert _value(registry, "qmgrd_smtpd_rejects_total", reason="syntax") == 1
    assert _value(registry, "qmgrd_smtpd_auth_failures_total", mechanism="PLAIN") == 1
    assert _value(registry, "qmgrd_smtpd_rejects_total", reason="other") == 0


async def test_a_connection_over_the_session_limit_is_a_limits_reject(tmp_path: Path) -> None:
    """A client refused at accept (smtpd_session_limit) counts as a connection and a
    ``limits`` reject, never as a session."""
    registry = CollectorRegistry(auto_describe=False)
    intake = IntakeMetrics(registry)
    spool = Spool(tmp_path / "spool", fsync=False)
    spool.ensure_dirs()
    settings = dataclasses.replace(loopback_settings(), session_limit=1)
    handle = await start_listener(settings, spool, on_commit=lambda _q: None, observer=intake)
    srv = Listening(handle, spool)
    try:
        first = await srv.chat()
        await first.cmd("EHLO client.test")
        reader, writer = await asyncio.open_connection("127.0.0.1", srv.port)
        line = await asyncio.wait_for(reader.readline(), TIMEOUT)
        assert line.startswith(b"421 4.3.2")
        writer.close()
        assert _value(registry, "qmgrd_smtpd_sessions") == 1
    finally:
        await asyncio.wait_for(srv.close(), TIMEOUT)
    assert _value(registry, "qmgrd_smtpd_connections_total") == 2
    assert _value(registry, "qmgrd_smtpd_rejects_total", reason="limits") == 1
    assert _value(registry, "qmgrd_smtpd_sessions") == 0
