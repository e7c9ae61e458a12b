"""Reloading the listener's settings (SIGHUP) applies to new SMTP sessions."""

from __future__ import annotations

import asyncio
import dataclasses
import smtplib
from pathlib import Path
from typing import Any

import pytest

from qmgrd.listener import ListenerSettings, parse_networks
from tests.support.listener import listening, loopback_settings


def _settings(**changes: Any) -> ListenerSettings:
    return loopback_settings(
        message_size_limit=10_000_000, smtpd_recipient_limit=100, smtpd_timeout=30.0, **changes
    )


def _send_from(port: int, source: str) -> tuple[int, bytes]:
    """RCPT from ``source``; returns the reply to RCPT TO."""
    with smtplib.SMTP("127.0.0.1", port, source_address=(source, 0), timeout=10) as client:
        client.ehlo("test")
        client.mail("s@example.com")
        return client.rcpt("r@example.org")


async def test_update_changes_mynetworks_for_new_sessions(tmp_path: Path) -> None:
    """A client refused under 127.0.0.1/32 may relay once mynetworks is reloaded as 127.0.0.0/8."""
    settings = _settings(mynetworks=parse_networks(["127.0.0.1/32"]))
    async with listening(tmp_path, settings) as srv:
        code, _text = await asyncio.to_thread(_send_from, srv.port, "127.0.0.2")
        assert code == 554
        srv.handle.update(
            dataclasses.replace(settings, mynetworks=parse_networks(["127.0.0.0/8"]))
        )
        code, _text = await asyncio.to_thread(_send_from, srv.port, "127.0.0.2")
        assert code == 250


@pytest.mark.parametrize("limit", [1])
async def test_update_changes_recipient_limit(tmp_path: Path, limit: int) -> None:
    """A lowered smtpd_recipient_limit applies to the next session: the extra RCPT gets 452."""
    settings = _settings(mynetworks=parse_networks(["127.0.0.0/8"]))

    def two_rcpts(port: int) -> int:
        with smtplib.SMTP("127.0.0.1", port, timeout=10) as client:
            client.ehlo("test")
            client.mail("s@example.com")
            client.rcpt("a@example.org")
            return client.rcpt("b@example.org")[0]

    async with listening(tmp_path, settings) as srv:
        srv.handle.update(dataclasses.replace(settings, smtpd_recipient_limit=limit))
        assert await asyncio.to_thread(two_rcpts, srv.port) == 452
