"""Relay control: only mynetworks (default loopback) may relay; rejections are logged safely."""

from __future__ import annotations

import dataclasses
import ipaddress
import socket
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from qmgrd.config import load_config
from qmgrd.listener import ListenerSettings
from qmgrd.log import render_postfix
from tests.support.config import write_config
from tests.support.listener import Chat, listening


def _default_settings(tmp_path: Path) -> ListenerSettings:
    return ListenerSettings.from_config(load_config(write_config(tmp_path), hostname="mx.test"))


def test_default_mynetworks_is_loopback_only(tmp_path: Path) -> None:
    """Out of the box 127.0.0.0/8 and ::1 may relay; nothing else, IPv4-mapped included."""
    settings = _default_settings(tmp_path)
    assert settings.mynetworks == (
        ipaddress.ip_network("127.0.0.0/8"),
        ipaddress.ip_network("::1/128"),
    )
    for addr in ("127.0.0.1", "127.1.2.3", "::1", "::ffff:127.0.0.1"):
        assert settings.permits_relay(addr), addr
    for addr in ("10.0.0.1", "192.168.1.1", "::2", "2001:db8::1", "::ffff:10.0.0.1", "unknown"):
        assert not settings.permits_relay(addr), addr


async def _session(host: str, port: int, lines: list[str]) -> list[str]:
    """Send ``lines`` one at a time; the last line of each reply (the 220 greeting first)."""
    chat, greeting = await Chat.open(host, port)
    replies = [greeting.splitlines()[-1]]
    try:
        for line in lines:
            replies.append((await chat.cmd(line)).splitlines()[-1])
    finally:
        await chat.close()
    return replies


TRANSACTION = [
    "EHLO client.test",
    "MAIL FROM:<s@src.test>",
    "RCPT TO:<r@dst.test>",
    "DATA",
]


async def test_loopback_client_relays_with_default_settings(tmp_path: Path) -> None:
    """127.0.0.1 is in the default mynetworks: the message is accepted and committed."""
    async with listening(tmp_path, _default_settings(tmp_path)) as srv:
        replies = await _session(
            "127.0.0.1", srv.port, [*TRANSACTION, "Subject: x\r\n\r\nhi\r\n.", "QUIT"]
        )
    assert [r[:3] for r in replies] == ["220", "250", "250", "250", "354", "250", "221"]
    assert len(srv.commits) == 1


def _ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
    except OSError:
        return False
    return True


@pytest.mark.skipif(not _ipv6_loopback(), reason="no IPv6 loopback here")
async def test_ipv6_loopback_client_relays_with_default_settings(tmp_path: Path) -> None:
    """[::1]/128 is in the default mynetworks: a client on ::1 may relay."""
    settings = dataclasses.replace(_default_settings(tmp_path), listen=(("::1", 0),))
    async with listening(tmp_path, settings) as srv:
        replies = await _session("::1", srv.port, TRANSACTION[:3])
    assert replies[-1].startswith("250 2.1.5")


async def test_client_outside_mynetworks_is_denied_and_logged(tmp_path: Path) -> None:
    """Outside mynetworks every RCPT gets 554 5.7.1, DATA has no recipient, nothing is queued,
    and each rejection is logged with the client address and the recipient."""
    settings = dataclasses.replace(
        _default_settings(tmp_path), mynetworks=(ipaddress.ip_network("10.0.0.0/8"),)
    )
    async with listening(tmp_path, settings) as srv:
        with capture_logs() as logs:
            replies = await _session(
                "127.0.0.1",
                srv.port,
                [
                    "EHLO client.test",
                    "MAIL FROM:<s@src.test>",
                    "RCPT TO:<r@dst.test>",
                    'RCPT TO:<"tab\there"@dst.test>',
                    "DATA",
                ],
            )
        assert srv.commits == [] and srv.spool.list_ids("incoming") == []
    assert replies[3] == "554 5.7.1 <r@dst.test>: Relay access denied"
    assert replies[4].startswith("554 5.7.1")
    assert replies[5].startswith("554 5.5.1")
    rejects = [e for e in logs if e["event"] == "NOQUEUE: reject"]
    assert [e["to"] for e in rejects] == ["<r@dst.test>", '<"tab\there"@dst.test>']
    assert all(e["client"] == "unknown[127.0.0.1]" for e in rejects)
    line = render_postfix(dict(rejects[1]))
    assert "\t" not in line and 'to=<"tab\\there"@dst.test>' in line
    assert "RCPT from unknown[127.0.0.1]: 554 5.7.1" in line
