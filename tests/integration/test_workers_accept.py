"""Listener workers share each listening socket: the kernel's one accept queue outlives a worker.

Why the workers inherit the queue manager's listening sockets rather than
binding one ``SO_REUSEPORT`` socket each (``docs/processes.md``): clients
waiting in the accept queue when a worker dies are served by another worker
(a dead ``SO_REUSEPORT`` socket's queue is reset), and a worker that cannot
accept leaves every new client to the others (``SO_REUSEPORT`` would hash
some of them to it whatever its state).
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
from pathlib import Path

from tests.integration.test_workers import TIMEOUT, _relay
from tests.support.listener import Chat
from tests.support.waits import wait_until

WAITING = 6  # clients connected while no worker accepts


async def test_clients_queued_while_no_worker_accepts_survive_a_worker_killed_meanwhile(
    tmp_path: Path,
) -> None:
    """Both workers stopped, WAITING clients connect (the kernel completes their handshakes
    and queues them); one worker is SIGKILLed, the other continued: every waiting client
    gets the greeting and is served; the dead worker is replaced and the port answers."""
    async with _relay(tmp_path, 2) as (relay, _sink):
        first = relay.proc.children()
        victim, survivor = first
        for pid in first:
            os.kill(pid, signal.SIGSTOP)
        try:  # blocking connects: each returns once the kernel queued the connection
            socks = [socket.create_connection(("127.0.0.1", relay.port)) for _ in range(WAITING)]
            os.kill(victim, signal.SIGKILL)
        finally:
            os.kill(survivor, signal.SIGCONT)
        opened = await asyncio.wait_for(asyncio.gather(*(_greeted(s) for s in socks)), TIMEOUT)
        assert [greeting[:4] for _, greeting in opened] == ["220 "] * WAITING
        for chat, _ in opened:
            assert (await chat.cmd("EHLO client.test")).startswith("250")
            assert (await chat.cmd("QUIT")).startswith("221")
            await chat.close()
        assert f"qmgrd/smtpd[{survivor}]: connect from" in relay.log()
        assert f"qmgrd/smtpd[{victim}]: connect from" not in relay.log()
        death = f"process qmgrd/smtpd pid {victim} killed by signal 9; restarting it"
        await wait_until(lambda: death in relay.log(), "the death in the log", TIMEOUT)
        await wait_until(
            lambda: len(relay.proc.children()) == 2 and victim not in relay.proc.children(),
            "a new worker",
            TIMEOUT,
        )
        assert (await relay.banner()).endswith("ESMTP first")  # the port answers


async def _greeted(sock: socket.socket) -> tuple[Chat, str]:
    """A connected socket as a ``Chat``, and the greeting it reads."""
    reader, writer = await asyncio.open_connection(sock=sock)
    chat = Chat(reader, writer)
    return chat, await chat.reply()
