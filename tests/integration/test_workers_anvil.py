"""Per-client limits over several listener processes: the queue manager counts (Postfix's anvil).

Two in-process listeners sharing one ``Anvil`` stand for two workers where the wiring is
the point; ``qmgrd run`` with two listener workers shows it end to end.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

from qmgrd.daemon.anvil import Anvil, AnvilClient
from qmgrd.daemon.ipc import parse
from qmgrd.listener import ListenerSettings
from tests.integration.test_listener_limits import _auth_creds, _plain
from tests.integration.test_workers import TIMEOUT, _relay, _stopped
from tests.support.listener import Chat, Listening, listening, loopback_settings
from tests.support.waits import wait_until

REFUSAL = "421 4.7.0 mx.test Error: too many connections from 127.0.0.1"


def _clients(anvil: Anvil, n: int, *, answered: bool = True) -> list[AnvilClient]:
    """``n`` worker-side clients of ``anvil`` (slots 1..n), answered on the next loop turn
    (or never, with a zero wait: the queue manager does not answer)."""
    clients: list[AnvilClient] = []
    for slot in range(1, n + 1):

        def send(data: bytes, slot: int = slot) -> None:
            answer = anvil.message(slot, parse(data))
            if answer is not None and answered:
                asyncio.get_running_loop().call_soon(clients[slot - 1].answer, parse(answer))

        clients.append(AnvilClient(send, wait=TIMEOUT if answered else 0))
    return clients


@contextlib.asynccontextmanager
async def _two_listeners(
    root: Path, settings: ListenerSettings, *, answered: bool = True
) -> AsyncIterator[tuple[Listening, Listening, Anvil, list[AnvilClient]]]:
    """Two in-process listeners whose per-client counts are one ``Anvil``'s (two workers')."""
    anvil = Anvil()
    clients = _clients(anvil, 2, answered=answered)
    async with listening(root / "a", settings) as a, listening(root / "b", settings) as b:
        a.handle.ctx.anvil, b.handle.ctx.anvil = clients
        yield a, b, anvil, clients


async def _greeting(srv: Listening) -> tuple[Chat, str]:
    chat, greeting = await Chat.open("127.0.0.1", srv.port)
    srv.chats.append(chat)
    return chat, greeting


async def test_two_listeners_sharing_the_anvil_count_one_clients_sessions_together(
    tmp_path: Path,
) -> None:
    """Limit 2: one session on each listener, the third on either gets Postfix's 421; after
    one ends, the client may connect again; the anvil's count follows every session."""
    settings = loopback_settings(client_connection_limit=2, limit_exceptions=())
    async with _two_listeners(tmp_path, settings) as (a, b, anvil, _):
        first, greeting = await _greeting(a)
        assert greeting.startswith("220 ")
        _, greeting = await _greeting(b)
        assert greeting.startswith("220 ")
        extra, refusal = await _greeting(b)
        assert refusal == REFUSAL
        assert await extra.closed()
        _, refusal = await _greeting(a)
        assert refusal == REFUSAL
        # each listener alone holds one session: its own count would have admitted both
        assert a.handle.ctx.counters.sessions("127.0.0.1") <= 1
        await first.cmd("QUIT")
        assert await first.closed()
        for _ in range(200):  # bounded: the session's end reaches the anvil
            if anvil.counters.sessions("127.0.0.1") == 1:
                break
            await asyncio.sleep(0.01)
        _, greeting = await _greeting(a)
        assert greeting.startswith("220 ")
    assert anvil.counters.total == 0  # every session counted was reported ended


async def test_auth_rate_limit_counts_auth_commands_on_every_listener(tmp_path: Path) -> None:
    """smtpd_client_auth_rate_limit = 2: one AUTH on each listener, the third (on either)
    gets Postfix's 450 4.7.1, counted by the shared anvil (each listener saw at most 2)."""
    settings = loopback_settings(
        client_connection_limit=0,
        limit_exceptions=(),
        sasl_credentials=_auth_creds(),
        auth_rate_limit=2,
        rate_time_unit=60,
    )
    async with _two_listeners(tmp_path, settings) as (a, b, _, _):
        replies = []
        for srv in (a, b, b):
            chat, _ = await _greeting(srv)
            await chat.cmd("EHLO c.test")
            replies.append(await chat.cmd("AUTH PLAIN " + _plain("alice", "bad")))
    assert [r[:3] for r in replies[:2]] == ["535", "535"]
    assert replies[2] == "450 4.7.1 Error: too many AUTH commands from 127.0.0.1"


async def test_unanswered_anvil_falls_back_to_each_listeners_own_count(tmp_path: Path) -> None:
    """The queue manager does not answer: each listener compares its own sessions (fail
    open: one session on each with limit 1), and its own limit still holds."""
    settings = loopback_settings(client_connection_limit=1, limit_exceptions=())
    async with _two_listeners(tmp_path, settings, answered=False) as (a, b, _, clients):
        for srv in (a, b):
            _, greeting = await _greeting(srv)
            assert greeting.startswith("220 ")
        _, refusal = await _greeting(a)
        assert refusal == REFUSAL
        assert all(client.degraded for client in clients)


async def test_connection_count_limit_holds_across_listener_workers(tmp_path: Path) -> None:
    """smtpd_client_connection_count_limit = 1 with two workers: a session on one worker, then
    the same client's session on the other gets 421 4.7.0 (the queue manager counts both);
    once the first ends, the client is served again."""
    async with _relay(
        tmp_path,
        2,
        "smtpd_client_connection_count_limit = 1\nsmtpd_client_event_limit_exceptions =\n",
    ) as (relay, _sink):
        first_worker, second_worker = relay.proc.children()
        with _stopped([second_worker]):
            held, greeting = await Chat.open("127.0.0.1", relay.port)
        assert greeting.startswith("220 ")
        with _stopped([first_worker]):
            refused, reply = await Chat.open("127.0.0.1", relay.port)
            assert reply == "421 4.7.0 mx.test Error: too many connections from 127.0.0.1"
            assert await refused.closed()
        await refused.close()
        line = f"qmgrd/smtpd[{second_worker}]: warning: Connection concurrency limit exceeded"
        await wait_until(lambda: line in relay.log(), "the refusal in the log", TIMEOUT)
        assert await held.cmd("QUIT") == "221 2.0.0 Bye"
        await held.close()
        for _ in range(200):  # bounded: until the end of the first session reached the count
            chat, greeting = await Chat.open("127.0.0.1", relay.port)
            await chat.close()
            if greeting.startswith("220 "):
                break
            await asyncio.sleep(0.05)
        assert greeting.startswith("220 "), greeting
