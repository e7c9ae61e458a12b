"""A listener holding its socket after a refusal for capacity still fills a place that frees.

``accepting.REFUSE_HOLD`` is made longer than any test here, so a client that
gets in before the hold ends can only have been let in by the session's end
(``Acceptor.room``), not by the end of the hold.
"""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

import pytest

from qmgrd.daemon.intakeflow import FlowSettings
from qmgrd.listener import accepting
from qmgrd.listener.inflow import OVERLOAD_REPLY
from tests.support.listener import Chat, listening, loopback_settings
from tests.support.regulator import worker_regulator
from tests.support.waits import TIMEOUT

CAP = 2


async def _greeted(sock: socket.socket) -> tuple[Chat, str]:
    """A connected socket as a ``Chat``, and the reply it reads first."""
    reader, writer = await asyncio.open_connection(sock=sock)
    chat = Chat(reader, writer)
    return chat, await chat.reply()


async def test_a_session_that_ends_during_a_hold_lets_the_longest_waiting_client_in(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """CAP sessions live, one more client refused (the listener holds its socket), then a
    client queued in the kernel: when one session ends, that client gets the greeting at
    once, and the cap still holds (CAP live, never more)."""
    monkeypatch.setattr(accepting, "REFUSE_HOLD", 3600.0)
    settings = FlowSettings(lag_limit=0.05, session_limit=CAP)
    with worker_regulator(settings) as regulator:
        async with listening(tmp_path, loopback_settings(session_limit=1000)) as srv:
            regulator.sessions = lambda: len(srv.handle.sessions)
            srv.handle.ctx.inflow = regulator.gate
            first, second = await srv.chat(), await srv.chat()
            refused, reply = await Chat.open("127.0.0.1", srv.port)
            assert reply == OVERLOAD_REPLY  # at the cap: refused, and the socket is held
            await refused.close()
            waiting = socket.create_connection(("127.0.0.1", srv.port))  # queued by the kernel
            assert (await first.cmd("QUIT")).startswith("221")
            late, greeting = await asyncio.wait_for(_greeted(waiting), TIMEOUT)
            assert greeting.startswith("220 ")
            assert len(srv.handle.sessions) == CAP  # the second and the late one
            assert regulator.gate.refused == 1
            assert (await late.cmd("QUIT")).startswith("221")
            assert (await second.cmd("QUIT")).startswith("221")
            await late.close()
