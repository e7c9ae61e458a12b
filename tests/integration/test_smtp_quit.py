"""``smtp_skip_quit_response``: how an SMTP client session ends, against scripted servers.

With ``yes`` (Postfix's default) QUIT is sent (behind the end of data when the
server pipelines, else on its own) and the connection is closed without
waiting for the reply: a server that never answers QUIT costs nothing. With
``no`` the reply is awaited, at most ``smtp_quit_timeout``.
"""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path

import pytest

from qmgrd.config import load_config
from qmgrd.daemon.assemble import create_agents
from qmgrd.delivery.agent import DeliveryResult, Outcome
from qmgrd.delivery.settings import SmtpSettings
from qmgrd.delivery.smtp import SmtpAgent
from tests.integration.sinks import make_request
from tests.support.scripted import FAST, Handler, read_line, scripted
from tests.support.waits import TIMEOUT

EHLO_PIPELINING = b"250-mx.test\r\n250 PIPELINING\r\n"
EHLO_PLAIN = b"250 mx.test\r\n"
BOUND = 30.0  # a client that waited for the default smtp_quit_timeout (300 s) fails here


@dataclasses.dataclass
class _Ends:
    """What the server saw at the end of the session."""

    quit_read: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)
    closed: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)  # EOF after QUIT
    answer: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)  # then say 221


def _server(ehlo: bytes, ends: _Ends) -> Handler:
    """Accepts one message; answers QUIT only when ``ends.answer`` is set."""

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"220 mx.test ESMTP\r\n")
        await writer.drain()
        in_data = False
        while True:
            line = await read_line(reader)
            if in_data:
                if line == b".":
                    in_data = False
                    writer.write(b"250 2.0.0 queued\r\n")
                    await writer.drain()
                continue
            if line.startswith(b"QUIT"):
                break
            if line.startswith(b"EHLO"):
                writer.write(ehlo)
            elif line == b"DATA":
                in_data = True
                writer.write(b"354 go\r\n")
            else:
                writer.write(b"250 ok\r\n")
            await writer.drain()
        ends.quit_read.set()
        closing = asyncio.ensure_future(reader.read())
        answering = asyncio.ensure_future(ends.answer.wait())
        await asyncio.wait({closing, answering}, return_when=asyncio.FIRST_COMPLETED)
        if not closing.done():
            writer.write(b"221 2.0.0 bye\r\n")
            await writer.drain()
        answering.cancel()
        if await closing == b"":
            ends.closed.set()

    return handler


async def _deliver(agent: SmtpAgent, nexthop: str) -> DeliveryResult:
    return await agent.deliver(make_request(nexthop, ["r@dst.test"]))


async def _deliver_and_close(ehlo: bytes, ends: _Ends, settings: SmtpSettings) -> DeliveryResult:
    """One delivery (bounded) and the agent closed; returns once the server saw the close."""
    async with scripted(_server(ehlo, ends)) as srv:
        agent = SmtpAgent(settings)
        try:
            result = await asyncio.wait_for(_deliver(agent, srv.nexthop), BOUND)
        finally:
            await agent.close()
        await asyncio.wait_for(ends.closed.wait(), TIMEOUT)
    return result


@pytest.mark.parametrize("ehlo", [EHLO_PIPELINING, EHLO_PLAIN], ids=["pipelining", "plain"])
async def test_skip_quit_response_yes_closes_without_waiting(ehlo: bytes) -> None:
    """The default: QUIT goes out and the session closes at once, though QUIT is never answered."""
    ends = _Ends()
    settings = dataclasses.replace(FAST, quit_timeout=300.0)
    assert settings.skip_quit_response  # Postfix's default
    result = await _deliver_and_close(ehlo, ends, settings)
    assert ends.quit_read.is_set() and not ends.answer.is_set()
    assert (result.recipients[0].outcome, result.hop) == (Outcome.SENT, None)


@pytest.mark.parametrize("ehlo", [EHLO_PIPELINING, EHLO_PLAIN], ids=["pipelining", "plain"])
async def test_skip_quit_response_no_waits_for_the_reply(ehlo: bytes) -> None:
    """With ``no`` the delivery waits for the QUIT reply; the session closes after it."""
    ends = _Ends()
    settings = dataclasses.replace(FAST, quit_timeout=300.0, skip_quit_response=False)
    async with scripted(_server(ehlo, ends)) as srv:
        agent = SmtpAgent(settings)
        try:
            task = asyncio.ensure_future(_deliver(agent, srv.nexthop))
            await asyncio.wait_for(ends.quit_read.wait(), TIMEOUT)
            for _ in range(20):  # loop turns: the client reads whatever has arrived
                await asyncio.sleep(0)
            assert not task.done() and not ends.closed.is_set()  # waiting for the 221
            ends.answer.set()
            result = await asyncio.wait_for(task, BOUND)
        finally:
            await agent.close()
        await asyncio.wait_for(ends.closed.wait(), TIMEOUT)
    assert (result.recipients[0].outcome, result.hop) == (Outcome.SENT, None)


async def test_skip_quit_response_no_gives_up_at_smtp_quit_timeout() -> None:
    """With ``no`` a server that never answers QUIT costs ``smtp_quit_timeout``, then closes."""
    ends = _Ends()
    settings = dataclasses.replace(FAST, quit_timeout=0.3, skip_quit_response=False)
    result = await _deliver_and_close(EHLO_PLAIN, ends, settings)
    assert not ends.answer.is_set()
    assert (result.recipients[0].outcome, result.hop) == (Outcome.SENT, None)


async def test_cached_session_closes_without_waiting_for_quit() -> None:
    """``close()`` QUITs an idle cached session and does not wait for the reply (default)."""
    ends = _Ends()
    async with scripted(_server(EHLO_PIPELINING, ends)) as srv:
        settings = dataclasses.replace(
            FAST, quit_timeout=300.0, connection_cache_destinations=(srv.nexthop,)
        )
        agent = SmtpAgent(settings)
        result = await asyncio.wait_for(_deliver(agent, srv.nexthop), BOUND)
        assert len(agent.cache) == 1 and not ends.quit_read.is_set()  # kept, no QUIT yet
        await asyncio.wait_for(agent.close(), BOUND)
        await asyncio.wait_for(ends.closed.wait(), TIMEOUT)
    assert ends.quit_read.is_set() and not ends.answer.is_set()
    assert result.recipients[0].outcome is Outcome.SENT


@pytest.mark.parametrize(("line", "expected"), [("", True), ("no", False), ("yes", True)])
def test_smtp_skip_quit_response_is_read_from_main_cf(
    tmp_path: Path, line: str, expected: bool
) -> None:
    """main.cf's ``smtp_skip_quit_response`` reaches the SMTP agent (default yes)."""
    setting = f"smtp_skip_quit_response = {line}\n" if line else ""
    (tmp_path / "main.cf").write_text(f"queue_directory = {tmp_path / 'spool'}\n{setting}")
    (tmp_path / "master.cf").write_text("smtp unix - - n - - smtp\n")
    agent = create_agents(load_config(tmp_path, hostname="mx.test"))["smtp"]
    assert isinstance(agent, SmtpAgent)
    assert agent.settings.skip_quit_response is expected
