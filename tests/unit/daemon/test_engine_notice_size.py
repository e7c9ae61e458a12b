"""Bounce size: bounce_size_limit decides what of the original a notice returns, and BODY."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from qmgrd.delivery.agent import DeliveryRequest, Outcome
from qmgrd.delivery.dsn import compose_dsn
from tests.support.agents import FakeAgent, Verdict
from tests.support.engine import create_test_engine, run_until_idle, stop_engine, submit

BIG_BODY = b"".join(b"line %04d of a long message body\r\n" % i for i in range(400))  # ~14 kB


def _bounce_bad(addr: str) -> Verdict:
    if addr.startswith("bad"):
        return Outcome.BOUNCED, "5.1.1", "550 5.1.1 no such user"
    return Outcome.SENT, "2.0.0", "250 ok"


def _notice(agent: FakeAgent) -> tuple[DeliveryRequest, bytes]:
    [(request, content)] = [
        (r, agent.contents[i]) for i, r in enumerate(agent.requests) if r.sender == ""
    ]
    return request, content


async def _bounce(tmp_path: Path, main: str, body: bytes) -> tuple[DeliveryRequest, bytes,
                                                                    list[int]]:
    """Bounce one message with ``body``; the notice's request, its bytes, and the length of
    the original each composition was given."""
    agent = FakeAgent(rule=_bounce_bad)
    engine, spool, clock = create_test_engine(tmp_path, agent, main)
    given: list[int] = []

    def spy(**kwargs: Any) -> bytes:
        given.append(len(kwargs["original_message"] or kwargs["original_headers"]))
        return compose_dsn(**kwargs)

    engine.composer.compose_full = spy
    submit(spool, clock, "sender@src.test", ["bad@a.test"], body)
    task = await run_until_idle(engine)
    await stop_engine(engine, task)
    request, content = _notice(agent)
    return request, content, given


async def test_default_limit_returns_the_whole_original(tmp_path: Path) -> None:
    """Under Postfix's 50,000 bytes the original is attached whole as message/rfc822."""
    _request, notice, _given = await _bounce(tmp_path, "", BIG_BODY)
    assert b"Content-Type: message/rfc822" in notice
    assert b"line 0399 of a long message body" in notice


async def test_a_small_bounce_size_limit_returns_headers_only(tmp_path: Path) -> None:
    """bounce_size_limit = 1000: the notice carries the headers, not the 14 kB body, and
    only limit + 2 bytes of the original were read."""
    _request, notice, given = await _bounce(tmp_path, "bounce_size_limit = 1000", BIG_BODY)
    assert b"Content-Type: text/rfc822-headers" in notice
    assert b"Subject: test" in notice
    assert b"line 0399" not in notice and b"message/rfc822" not in notice
    assert given and all(n <= 1002 for n in given)
    assert len(notice) < 6000


async def test_an_8bit_original_makes_an_8bitmime_notice(tmp_path: Path) -> None:
    """A notice that attaches 8-bit bytes is queued (and relayed) with BODY=8BITMIME."""
    request, notice, _given = await _bounce(tmp_path, "", "caf\u00e9 cr\u00e8me\r\n".encode())
    assert not notice.isascii()
    assert request.body_8bitmime


async def test_an_ascii_notice_is_not_8bitmime(tmp_path: Path) -> None:
    """An ASCII notice keeps the envelope without BODY (7-bit)."""
    request, notice, _given = await _bounce(tmp_path, "", b"plain\r\n")
    assert notice.isascii()
    assert not request.body_8bitmime
