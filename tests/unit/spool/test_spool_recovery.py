"""Recovery paths: a system error on a queue file is not corruption, and foreign log entries."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

import pytest

from qmgrd.config import load_config
from qmgrd.daemon.assemble import create_engine
from qmgrd.daemon.engine import Engine
from qmgrd.errors import SpoolError
from qmgrd.spool import (
    Envelope,
    QueueFileContent,
    QueueFileIOError,
    RecipientSpec,
    Spool,
    loadread,
    mark_done,
    records,
)
from tests.support.clock import FakeClock
from tests.unit.spool.test_spool_reasons_torn import BouncingAgent, _conf

ENV = Envelope("s@example.com", (RecipientSpec("r@example.com"),), 1_700_000_000.0)


@pytest.fixture
def spool(tmp_path: Path) -> Spool:
    s = Spool(tmp_path / "spool", fsync=False)
    s.ensure_dirs()
    return s


async def _retry_until_delivered(engine: Engine, clock: FakeClock, agent: BouncingAgent) -> None:
    """Move the fake clock past each retry (the engine's retry delay, or the backoff) and wait
    for the engine to settle, until something was delivered: at most 5 rounds of 5 s each."""
    for _ in range(5):
        with contextlib.suppress(TimeoutError):  # a retry is pending on the fake clock
            await asyncio.wait_for(engine.wait_idle(), 5)
        if agent.requests:
            return
        clock.advance(600)
        engine.request_deferred_scan()


def _failing_open(err: int) -> Callable[[Path, int, int], int]:
    def fake(path: Path, flags: int, mode: int = 0o600) -> int:
        raise OSError(err, os.strerror(err))

    return fake


@pytest.mark.parametrize("err", [errno.EMFILE, errno.ENFILE, errno.EIO, errno.EACCES])
def test_system_errors_on_a_queue_file_are_io_errors_not_corruption(
    spool: Spool, monkeypatch: pytest.MonkeyPatch, err: int
) -> None:
    """Open, recipient reads and done marks that hit EMFILE/EIO/... raise QueueFileIOError."""
    qid = spool.commit(ENV, b"x\r\n")
    qf = spool.open("incoming", qid)
    monkeypatch.setattr(records, "open_regular", _failing_open(err))
    for call in (
        lambda: spool.open("incoming", qid),
        lambda: qf.read_recipients(qf.first_recipient_offset, 10),
        lambda: mark_done(qf.path, [qf.first_recipient_offset], fsync=False),
    ):
        with pytest.raises(QueueFileIOError, match=os.strerror(err)):
            call()


def test_content_read_error_is_an_io_error(spool: Spool) -> None:
    """A content read that fails because the file vanished is a QueueFileIOError."""
    qid = spool.commit(ENV, b"x\r\n")
    content = QueueFileContent.of(spool.open("incoming", qid))
    spool.remove("incoming", qid)
    with pytest.raises(QueueFileIOError):
        content.read()


@pytest.mark.parametrize(
    "damage",
    [
        lambda data: data[: len(data) - 5],  # truncated
        lambda data: b"X" + data[1:],  # no size record
        lambda data: data[:70] + b"\xff" * 10 + data[80:],  # garbage in the records
    ],
)
def test_damaged_files_are_corrupt_not_io_errors(
    spool: Spool, damage: Callable[[bytes], bytes]
) -> None:
    """A truncated or garbled file raises a plain SpoolError: it is quarantined, not retried."""
    qid = spool.commit(ENV, b"hello\r\n")
    path = spool.path("incoming", qid)
    path.write_bytes(damage(path.read_bytes()))
    with pytest.raises(SpoolError) as info:
        qf = spool.open("incoming", qid)
        qf.read_all_recipients()
    assert not isinstance(info.value, QueueFileIOError)


async def test_emfile_while_loading_does_not_quarantine_the_message(
    tmp_path: Path, spool: Spool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Running out of file descriptors while a message is loaded leaves it queued, then it is
    delivered: it never goes to corrupt/."""
    agent = BouncingAgent()
    clock = FakeClock()
    engine = create_engine(
        load_config(_conf(tmp_path), hostname="mx.test"),
        spool=spool,
        clock=clock,
        agents={"smtp": agent, "relay": agent},
    )
    real = records.open_regular_stat
    failures = {"left": 1}

    def flaky(path: Path | str, flags: int, mode: int = 0o600) -> tuple[int, os.stat_result]:
        if Path(path).parent.name == "active" and failures["left"]:
            failures["left"] -= 1
            raise OSError(errno.EMFILE, os.strerror(errno.EMFILE))
        return real(path, flags, mode)

    monkeypatch.setattr(loadread, "open_regular_stat", flaky)  # the load's one open
    qid = spool.commit(ENV, b"Subject: t\r\n\r\nhello\r\n")
    task = asyncio.create_task(engine.run())
    try:
        await _retry_until_delivered(engine, clock, agent)
    finally:
        engine.stop()
        await asyncio.wait_for(task, 20)
    assert spool.list_ids("corrupt") == []
    assert [(r.queue_id, r.recipients[0].address) for r in agent.requests] == [
        (qid, "r@example.com")
    ]


@pytest.mark.parametrize("kind", ["defer", "bounce"])
async def test_directory_in_a_reason_log_slot_does_not_wedge_its_message(
    tmp_path: Path, spool: Spool, kind: str
) -> None:
    """A directory where ``bounce/ID`` or ``defer/ID`` belongs is moved to corrupt/ at start
    (as ``bounce.ID``), and the message is delivered instead of failing every load."""
    agent = BouncingAgent()
    engine = create_engine(
        load_config(_conf(tmp_path), hostname="mx.test"),
        spool=spool,
        clock=FakeClock(),
        agents={"smtp": agent, "relay": agent},
    )
    qid = spool.commit(ENV, b"Subject: t\r\n\r\nhello\r\n")
    (spool.root / kind / qid).mkdir()
    task = asyncio.create_task(engine.run())
    try:
        await asyncio.wait_for(engine.wait_idle(), 20)
    finally:
        engine.stop()
        await asyncio.wait_for(task, 20)
    assert [r.queue_id for r in agent.requests] == [qid]
    assert os.listdir(spool.root / "corrupt") == [f"{kind}.{qid}"]
    assert spool.list_ids("incoming") == spool.list_ids("deferred") == []


def test_sweep_never_replaces_a_file_already_in_corrupt(spool: Spool) -> None:
    """When every suffixed name is taken, the stray file stays put rather than overwrite one."""
    corrupt = spool.root / "corrupt"
    (corrupt / "junk").write_text("old")
    for n in range(1, 1000):
        (corrupt / f"junk~{n}").write_text("old")
    (spool.root / "incoming" / "junk").write_text("new")
    assert spool.sweep_foreign() == 0
    assert (spool.root / "incoming" / "junk").read_text() == "new"
    assert {p.read_text() for p in corrupt.iterdir()} == {"old"}


async def test_eio_while_reading_recipients_does_not_quarantine_the_message(
    tmp_path: Path, spool: Spool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An I/O error on a recipient batch read defers the message; it is delivered later and
    never goes to corrupt/."""
    agent = BouncingAgent()
    clock = FakeClock()
    engine = create_engine(
        load_config(_conf(tmp_path), hostname="mx.test"),
        spool=spool,
        clock=clock,
        agents={"smtp": agent, "relay": agent},
    )
    real = records.recipients_from
    opens = {"active": 0}

    def flaky(f: BinaryIO, size: int, path: Path, offset: int, limit: int) -> Any:
        if path.parent.name == "active":
            opens["active"] += 1
            if opens["active"] == 1:  # the first recipient read, after the envelope
                raise OSError(errno.EIO, os.strerror(errno.EIO))
        return real(f, size, path, offset, limit)

    monkeypatch.setattr(loadread, "recipients_from", flaky)  # the load's recipient read
    # ... as the record stream makes it (a file read whole is parsed from its bytes first)
    monkeypatch.setattr(loadread, "_recipients", lambda data, offset, limit: None)
    qid = spool.commit(ENV, b"Subject: t\r\n\r\nhello\r\n")
    task = asyncio.create_task(engine.run())
    try:
        await _retry_until_delivered(engine, clock, agent)
    finally:
        engine.stop()
        await asyncio.wait_for(task, 20)
    assert opens["active"] >= 2
    assert spool.list_ids("corrupt") == []
    assert [r.queue_id for r in agent.requests] == [qid]
