"""Client limits of the listener over real SMTP on 127.0.0.1: caps, error limits, AUTH, fds."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
import ipaddress
import os
import resource
import socket
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from qmgrd.listener import ListenerHandle, ListenerSettings, start_listener
from qmgrd.listener.auth import Credentials, PasswordChecker, hash_password, parse_password_file
from qmgrd.listener.commands import HANDLERS
from qmgrd.spool import Spool

TIMEOUT = 20
SETTINGS = ListenerSettings(
    listen=(("127.0.0.1", 0),),
    myhostname="mx.test",
    mynetworks=(ipaddress.ip_network("127.0.0.1/32"),),
    message_size_limit=100_000,
    smtpd_recipient_limit=10,
    smtpd_timeout=30,
)
MESSAGE = [
    "EHLO c.test",
    "MAIL FROM:<s@src.test>",
    "RCPT TO:<r@dst.test>",
    "DATA",
]


class Clock:
    """A settable wall clock for the listener (rate windows, arrival times)."""

    def __init__(self) -> None:
        self.now = 1e9

    def __call__(self) -> float:
        return self.now


@dataclasses.dataclass
class Server:
    handle: ListenerHandle
    spool: Spool
    commits: list[str]

    @property
    def port(self) -> int:
        return self.handle.addresses[0][1]


@contextlib.asynccontextmanager
async def listening(
    tmp_path: Path,
    settings: ListenerSettings,
    clock: Clock | None = None,
    passwords: PasswordChecker | None = None,
) -> AsyncIterator[Server]:
    spool = Spool(tmp_path / "spool")
    spool.ensure_dirs()
    commits: list[str] = []
    handle = await start_listener(
        settings,
        spool,
        on_commit=lambda c: commits.append(c.queue_id),
        clock=clock or Clock(),
        passwords=passwords,
    )
    try:
        yield Server(handle, spool, commits)
    finally:
        await asyncio.wait_for(handle.wait_closed(), TIMEOUT)


class Client:
    """A line-oriented SMTP client over asyncio streams (every read bounded)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    @classmethod
    async def connect(cls, port: int, source: str = "127.0.0.1") -> tuple[Client, str]:
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection("127.0.0.1", port, local_addr=(source, 0)), TIMEOUT
        )
        client = cls(reader, writer)
        return client, await client.reply()

    async def reply(self) -> str:
        """The last line of the next reply ("" at end of stream)."""
        while True:
            line = await asyncio.wait_for(self.reader.readline(), TIMEOUT)
            text = line.decode("utf-8", "replace").rstrip("\r\n")
            if not line or text[3:4] != "-":
                return text

    async def cmd(self, line: str) -> str:
        self.writer.write(line.encode("utf-8", "surrogateescape") + b"\r\n")
        return await self.reply()

    async def send_message(self, body: bytes = b"Subject: t\r\n\r\nhi\r\n") -> str:
        for line in MESSAGE:
            reply = await self.cmd(line)
            if not reply.startswith(("2", "3")):
                return reply
        self.writer.write(body + b".\r\n")
        return await self.reply()

    def close(self) -> None:
        self.writer.close()


async def _wait_for(predicate: object, what: str) -> None:
    """Wait (bounded, on the loop) until ``predicate()`` is true."""
    assert callable(predicate)
    for _ in range(2000):
        if predicate():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"timed out waiting for {what}")


async def test_greeting_uses_smtpd_banner(tmp_path: Path) -> None:
    """The 220 greeting is smtpd_banner; without one it is "$myhostname ESMTP qmgrd"."""
    async with listening(
        tmp_path, dataclasses.replace(SETTINGS, smtpd_banner="relay.example ESMTP ready")
    ) as srv:
        client, greeting = await Client.connect(srv.port)
        client.close()
    assert greeting == "220 relay.example ESMTP ready"
    async with listening(tmp_path / "2", SETTINGS) as srv:
        client, greeting = await Client.connect(srv.port)
        client.close()
    assert greeting == "220 mx.test ESMTP qmgrd"


async def test_per_client_connection_limit_refuses_with_421_and_others_are_served(
    tmp_path: Path,
) -> None:
    """Idle sessions from one address beyond the limit get 421 4.7.0 (logged); others go on."""
    settings = dataclasses.replace(SETTINGS, client_connection_limit=3)
    async with listening(tmp_path, settings) as srv:
        idle = []
        for _ in range(3):
            client, greeting = await Client.connect(srv.port, "127.0.0.2")
            assert greeting.startswith("220 ")
            idle.append(client)
        with capture_logs() as logs:
            extra, refusal = await Client.connect(srv.port, "127.0.0.2")
            assert await extra.reply() == ""  # closed after the 421
            extra.close()
        assert refusal == "421 4.7.0 mx.test Error: too many connections from 127.0.0.2"
        (event,) = [e for e in logs if e["event"] == "Connection concurrency limit exceeded"]
        assert (event["client"], event["count"], event["log_level"]) == (
            "unknown[127.0.0.2]",
            4,
            "warning",
        )
        # mynetworks (127.0.0.1) is exempt by default, and is served while the others idle.
        good, _ = await Client.connect(srv.port)
        assert (await good.send_message()).startswith("250 2.0.0 Ok: queued as ")
        good.close()
        # When one idle session ends, that address may connect again.
        idle.pop().close()
        await _wait_for(lambda: srv.handle.ctx.counters.sessions("127.0.0.2") == 2, "a session end")
        again, greeting = await Client.connect(srv.port, "127.0.0.2")
        assert greeting.startswith("220 ")
        for client in [*idle, again]:
            client.close()


async def test_session_limit_refuses_with_421_4_3_2_and_recovers(tmp_path: Path) -> None:
    """Beyond smtpd_session_limit new clients get 421 4.3.2 (logged); a free slot serves again."""
    settings = dataclasses.replace(SETTINGS, session_limit=4)
    async with listening(tmp_path, settings) as srv:
        idle = [(await Client.connect(srv.port))[0] for _ in range(4)]
        with capture_logs() as logs:
            extra, refusal = await Client.connect(srv.port)
            extra.close()
        assert refusal == "421 4.3.2 Service currently unavailable"
        assert any(e["event"] == "session limit reached: connection refused" for e in logs)
        idle.pop().close()
        await _wait_for(lambda: srv.handle.ctx.counters.total == 3, "a session end")
        good, greeting = await Client.connect(srv.port)
        assert greeting.startswith("220 ")
        assert (await good.send_message()).startswith("250 2.0.0 Ok: queued as ")
        for client in [*idle, good]:
            client.close()


async def test_hard_error_limit_ends_the_session_with_postfix_wording(tmp_path: Path) -> None:
    """smtpd_hard_error_limit errors end the session: 421 4.7.0 HOST Error: too many errors."""
    settings = dataclasses.replace(SETTINGS, hard_error_limit=3)
    async with listening(tmp_path, settings) as srv:
        client, _ = await Client.connect(srv.port)
        with capture_logs() as logs:
            replies = [
                await client.cmd(line) for line in ("EHLO c", "BOGUS", "RCPT TO:<a@b>", "XYZ")
            ]
            closing = await client.reply()
            assert await client.reply() == ""
        client.close()
    assert [r[:3] for r in replies] == ["250", "502", "503", "502"]
    assert closing == "421 4.7.0 mx.test Error: too many errors"
    assert any(e["event"] == "too many errors" and e["after"] == "XYZ" for e in logs)


async def test_junk_commands_beyond_the_limit_count_as_errors(tmp_path: Path) -> None:
    """NOOP/RSET beyond smtpd_junk_command_limit count as errors, up to the hard limit."""
    settings = dataclasses.replace(SETTINGS, junk_command_limit=5, hard_error_limit=2)
    async with listening(tmp_path, settings) as srv:
        client, _ = await Client.connect(srv.port)
        replies = [await client.cmd(v) for v in ("NOOP", "RSET", "NOOP", "RSET", "NOOP", "NOOP")]
        last = await client.cmd("NOOP")  # the 7th: its 250, then the session ends
        closing = await client.reply()
        client.close()
    assert all(r.startswith("250") for r in [*replies, last])
    assert closing == "421 4.7.0 mx.test Error: too many errors"


def _auth_creds() -> Credentials:
    return parse_password_file(f"alice:{hash_password('pw', iterations=1000)}\n", "test")


def _plain(user: str, password: str) -> str:
    return base64.b64encode(f"\0{user}\0{password}".encode()).decode()


async def test_auth_rate_limit_per_client_and_window(tmp_path: Path) -> None:
    """smtpd_client_auth_rate_limit AUTHs per anvil_rate_time_unit, then 450 4.7.1 until it ends."""
    clock = Clock()
    settings = dataclasses.replace(
        SETTINGS, sasl_credentials=_auth_creds(), auth_rate_limit=2, rate_time_unit=60
    )
    async with listening(tmp_path, settings, clock) as srv:
        client, _ = await Client.connect(srv.port, "127.0.0.2")
        await client.cmd("EHLO c")
        first = await client.cmd("AUTH PLAIN " + _plain("alice", "bad"))
        second = await client.cmd("AUTH PLAIN " + _plain("alice", "bad"))
        with capture_logs() as logs:
            third = await client.cmd("AUTH PLAIN " + _plain("alice", "pw"))
        client.close()
        clock.now += 60
        client, _ = await Client.connect(srv.port, "127.0.0.2")
        await client.cmd("EHLO c")
        later = await client.cmd("AUTH PLAIN " + _plain("alice", "pw"))
        client.close()
        # mynetworks is exempt.
        exempt, _ = await Client.connect(srv.port)
        await exempt.cmd("EHLO c")
        for _ in range(2):
            await exempt.cmd("AUTH PLAIN " + _plain("nobody", "x"))
        exempt_reply = await exempt.cmd("AUTH PLAIN " + _plain("alice", "pw"))
        exempt.close()
    assert first.startswith("535") and second.startswith("535")
    assert third == "450 4.7.1 Error: too many AUTH commands from 127.0.0.2"
    assert any(e["event"] == "AUTH command rate limit exceeded" and e["count"] == 3 for e in logs)
    assert later.startswith("235")
    assert exempt_reply.startswith("235")


class _StuckCredentials(Credentials):
    """Credentials whose check blocks until released: a password pool fully busy."""

    release: threading.Event

    def verify(self, user: str, password: str) -> bool:
        self.release.wait(TIMEOUT)
        return False


async def test_auth_flood_does_not_delay_ordinary_mail(tmp_path: Path) -> None:
    """200 sessions stuck in AUTH: an ordinary client still gets its 250 within 1 s."""
    base = _auth_creds()
    stuck = _StuckCredentials(base.accounts, base.dummy)
    object.__setattr__(stuck, "release", threading.Event())
    settings = dataclasses.replace(SETTINGS, sasl_credentials=stuck)
    passwords = PasswordChecker(workers=1, max_waiting=4)
    try:
        async with listening(tmp_path, settings, passwords=passwords) as srv:

            async def flooder() -> str:
                client, _ = await Client.connect(srv.port)
                try:
                    await client.cmd("EHLO f")
                    return await client.cmd("AUTH PLAIN " + _plain("alice", "x"))
                finally:
                    client.close()

            flood = [asyncio.create_task(flooder()) for _ in range(200)]
            await _wait_for(lambda: passwords.pending == passwords.max_pending, "a full pool")
            started = time.monotonic()
            good, _ = await Client.connect(srv.port)
            reply = await good.send_message()
            elapsed = time.monotonic() - started
            good.close()
            stuck.release.set()
            results = await asyncio.wait_for(asyncio.gather(*flood), TIMEOUT)
    finally:
        stuck.release.set()
    assert reply.startswith("250 2.0.0 Ok: queued as "), reply
    assert elapsed < 1.0, f"250 after {elapsed:.2f}s"
    assert results.count("454 4.7.0 Temporary authentication failure") >= 190
    assert sum(r.startswith("535") for r in results) == 5  # the one running and four waiting


async def test_fd_exhaustion_in_accept_is_logged_and_survived(tmp_path: Path) -> None:
    """EMFILE in accept is logged; once descriptors are free the waiting clients are served."""
    async with listening(tmp_path, SETTINGS) as srv:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        used = len(os.listdir("/proc/self/fd"))
        clients: list[socket.socket] = []
        try:
            with capture_logs() as logs:
                resource.setrlimit(resource.RLIMIT_NOFILE, (used + 6, hard))
                # Clients until this process (theirs and the server's) has no descriptor left:
                # the server's accept of the last ones fails (no accept is tried while no
                # client waits, so the clients must outnumber what is free).
                for _ in range(12):
                    try:
                        sock = socket.socket()
                    except OSError:
                        break
                    sock.setblocking(False)
                    with contextlib.suppress(BlockingIOError):
                        sock.connect(("127.0.0.1", srv.port))
                    clients.append(sock)
                await _wait_for(
                    lambda: any(e["event"].startswith("accept connection") for e in logs),
                    "the EMFILE warning",
                )
        finally:
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        (warning, *_) = [e for e in logs if e["event"].startswith("accept connection")]
        assert warning["log_level"] == "warning" and "Too many open files" in warning["error"]
        for sock in clients:
            sock.close()
        good, greeting = await Client.connect(srv.port)
        assert greeting.startswith("220 ")
        assert (await good.send_message()).startswith("250 2.0.0 Ok: queued as ")
        good.close()


async def test_a_bug_in_a_command_ends_only_that_session_and_is_reported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A handler that raises closes its own session (logged as an error); others are served."""

    async def broken(session: object, arg: str) -> None:
        raise RuntimeError("boom")

    monkeypatch.setitem(HANDLERS, "NOOP", broken)
    reported: list[BaseException] = []
    loop = asyncio.get_running_loop()
    loop.set_exception_handler(lambda _loop, ctx: reported.append(ctx["exception"]))
    try:
        async with listening(tmp_path, SETTINGS) as srv:
            client, _ = await Client.connect(srv.port)
            with capture_logs() as logs:
                assert await client.cmd("NOOP") == ""  # closed, no reply
            client.close()
            good, _ = await Client.connect(srv.port)
            assert (await good.send_message()).startswith("250 2.0.0 Ok: queued as ")
            good.close()
    finally:
        loop.set_exception_handler(None)
    (event,) = [e for e in logs if e["event"] == "internal error in SMTP session"]
    assert event["log_level"] == "error" and "boom" in event["error"]
    assert [str(e) for e in reported] == ["boom"]
