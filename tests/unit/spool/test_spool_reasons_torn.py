"""Torn reason lines (issue 9, item 7): a short write at ENOSPC never costs a recipient's bounce."""

from __future__ import annotations

import asyncio
import errno
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from qmgrd.config import load_config
from qmgrd.daemon.assemble import create_engine
from qmgrd.delivery.agent import DeliveryRequest, DeliveryResult, Outcome, RecipientResult
from qmgrd.errors import SpoolError
from qmgrd.spool import Envelope, ReasonRecord, RecipientSpec, Spool
from tests.support.clock import FakeClock

REAL_WRITE = os.write


def _record(address: str, reason: str = "550 5.1.1 no such user") -> ReasonRecord:
    return ReasonRecord(address, "5.1.1", "failed", reason, 1_700_000_000.0, "mx[192.0.2.1]:25")


@dataclass
class DiskFull:
    """os.write that, while armed, writes part of a reason record and then fails with ENOSPC."""

    armed: int = 0  # how many reason appends to break
    broken: int = 0
    fail_next: bool = False

    def __call__(self, fd: int, data: bytes | memoryview) -> int:
        head = bytes(data[:16])
        if self.fail_next:
            self.fail_next = False
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        if self.armed and (head.startswith(b'{"address":') or head.startswith(b'\n{"address":')):
            self.armed -= 1
            self.broken += 1
            self.fail_next = True  # the loop's next write, for the rest, hits the full disk
            return REAL_WRITE(fd, bytes(data[: len(data) // 2]))
        return REAL_WRITE(fd, data)


@pytest.fixture
def disk_full(monkeypatch: pytest.MonkeyPatch) -> Iterator[DiskFull]:
    fake = DiskFull()
    monkeypatch.setattr(os, "write", fake)
    yield fake


@pytest.fixture
def spool(tmp_path: Path) -> Spool:
    s = Spool(tmp_path / "spool", fsync=False)
    s.ensure_dirs()
    return s


QID = "4Q0000000000AAA"


def test_short_write_is_truncated_back_and_the_retry_is_read(
    spool: Spool, disk_full: DiskFull
) -> None:
    """After a half-written append fails, the log is as before and the retried record is read."""
    spool.append_reasons("bounce", QID, [_record("first@a.test")])
    before = (spool.root / "bounce" / QID).read_bytes()
    disk_full.armed = 1
    with pytest.raises(SpoolError, match="No space left on device"):
        spool.append_reasons("bounce", QID, [_record("second@a.test")])
    assert disk_full.broken == 1
    assert (spool.root / "bounce" / QID).read_bytes() == before
    spool.append_reasons("bounce", QID, [_record("second@a.test")])
    assert [r.address for r in spool.read_reasons("bounce", QID)] == [
        "first@a.test",
        "second@a.test",
    ]


def test_failed_fsync_is_truncated_back(
    spool: Spool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A write that completed but could not be made durable is undone too (the caller retries)."""

    def failing_fsync(_fd: int) -> None:
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    durable = Spool(spool.root, fsync=True)
    monkeypatch.setattr(os, "fsync", failing_fsync)
    with pytest.raises(SpoolError, match="Input/output error"):
        durable.append_reasons("defer", QID, [_record("a@a.test")])
    assert (spool.root / "defer" / QID).read_bytes() == b""


def test_append_after_a_torn_line_starts_a_new_line(spool: Spool) -> None:
    """A torn tail left by a crash (no truncate possible) cannot swallow the next record."""
    path = spool.root / "bounce" / QID
    spool.append_reasons("bounce", QID, [_record("first@a.test")])
    with path.open("ab") as f:
        f.write(b'{"address":"torn@a.test","dsn":"5.')
    spool.append_reasons("bounce", QID, [_record("retried@a.test")])
    with capture_logs() as logs:
        got = spool.read_reasons("bounce", QID)
    assert [r.address for r in got] == ["first@a.test", "retried@a.test"]
    assert [e["event"] for e in logs] == ["malformed reason record skipped"]


def test_reader_recovers_a_record_glued_to_a_torn_one(spool: Spool) -> None:
    """Logs written by older versions (torn record + retry on one line) still yield the retry."""
    path = spool.root / "bounce" / QID
    spool.append_reasons("bounce", QID, [_record("glued@a.test", 'reply {"address":"x"}')])
    whole = path.read_bytes()
    path.write_bytes(whole[: len(whole) // 2] + whole)
    with capture_logs() as logs:
        got = spool.read_reasons("bounce", QID)
    assert [(r.address, r.reason) for r in got] == [("glued@a.test", 'reply {"address":"x"}')]
    assert logs[0]["recovered"] == "a record appended after it"


# -- through the engine: the bounce is still sent ---------------------------------------------


@dataclass
class BouncingAgent:
    """Bounces every recipient starting with "bad", sends the rest; records requests."""

    requests: list[DeliveryRequest] = field(default_factory=list)
    contents: list[bytes] = field(default_factory=list)
    rule: Callable[[str], bool] = lambda address: address.startswith("bad")

    async def deliver(self, request: DeliveryRequest) -> DeliveryResult:
        """One result per recipient, after reading the content like a real agent."""
        self.requests.append(request)
        self.contents.append(b"".join([c async for c in request.content.chunks()]))
        results = []
        for r in request.recipients:
            if self.rule(r.address):
                results.append(
                    RecipientResult(r, Outcome.BOUNCED, "5.1.1", "550 5.1.1 no such user", "mx")
                )
            else:
                results.append(RecipientResult(r, Outcome.SENT, "2.0.0", "250 ok", "mx"))
        return DeliveryResult(tuple(results), None)

    async def close(self) -> None:
        """Nothing to release."""


def _conf(tmp_path: Path) -> Path:
    conf = tmp_path / "conf"
    conf.mkdir()
    (conf / "main.cf").write_text(
        f"queue_directory = {tmp_path / 'spool'}\nmyhostname = mx.test\n"
    )
    (conf / "master.cf").write_text(
        "smtp unix - - n - - smtp\nrelay unix - - n - - smtp\n"
        "error unix - - n - - error\nretry unix - - n - - retry\n"
        "discard unix - - n - - discard\n"
    )
    return conf


async def test_every_bounce_is_sent_after_an_enospc_mid_append(
    tmp_path: Path, spool: Spool, disk_full: DiskFull
) -> None:
    """ENOSPC half-way through one bounce record while another destination's bounce follows in
    the same pass: the sender still gets a bounce naming each of the two recipients."""
    agent = BouncingAgent()
    clock = FakeClock()
    engine = create_engine(
        load_config(_conf(tmp_path), hostname="mx.test"),
        spool=spool,
        clock=clock,
        agents={"smtp": agent, "relay": agent},
    )
    qid = spool.commit(
        Envelope(
            "sender@src.test",
            tuple(RecipientSpec(a) for a in ("bad1@a.test", "bad2@b.test", "good@c.test")),
            clock.now(),
        ),
        b"Subject: t\r\n\r\nhello\r\n",
    )
    disk_full.armed = 1
    task = asyncio.create_task(engine.run())
    try:
        await asyncio.wait_for(engine.wait_idle(), 20)
        assert disk_full.broken == 1
        assert spool.list_ids("deferred") == [qid]  # the recipient whose record failed stays R
        clock.advance(301)  # minimal_backoff_time
        engine.request_deferred_scan()
        await asyncio.wait_for(engine.wait_idle(), 20)
    finally:
        engine.stop()
        await asyncio.wait_for(task, 20)
    notices = [i for i, r in enumerate(agent.requests) if r.sender == ""]
    assert len(notices) == 2
    for i in notices:
        assert [r.address for r in agent.requests[i].recipients] == ["sender@src.test"]
    text = b"".join(agent.contents[i] for i in notices)
    assert b"bad1@a.test" in text and b"bad2@b.test" in text
    sent = [r.address for q in agent.requests if q.sender for r in q.recipients]
    assert "good@c.test" in sent
    assert spool.list_ids("deferred") == [] and spool.list_ids("active") == []
