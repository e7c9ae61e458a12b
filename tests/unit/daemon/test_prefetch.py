"""The load's read-ahead answers a read request exactly as read_recipients would; the load
opens and reads each queue file once."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from qmgrd.core.message import Message, ReadRequest
from qmgrd.core.params import READ_BATCH_LIMIT
from qmgrd.daemon import loading
from qmgrd.daemon.loading import PREFETCH
from qmgrd.daemon.prefetch import _from_prefetch
from qmgrd.daemon.reading import RecipientReader
from qmgrd.daemon.table import ActiveMessage
from qmgrd.spool import Envelope, QueueFile, RecipientSpec, Spool, loadread, mark_done, records
from qmgrd.spool.loadread import load_queue_file
from tests.support.agents import FakeAgent
from tests.support.engine import create_test_engine, run_until_idle, stop_engine, submit


def _message(spool: Spool, count: int, done: set[int]) -> ActiveMessage:
    envelope = Envelope(
        sender="s@x.test",
        recipients=tuple(RecipientSpec(f"r{i}@y.test") for i in range(count)),
        arrival_time=1_000_000_000.0,
    )
    qid = spool.commit(envelope, b"body\n")
    path = spool.path("incoming", qid)
    every = QueueFile.open(path).read_all_recipients()
    mark_done(path, [r.offset for i, r in enumerate(every) if i in done], fsync=False)
    qf = QueueFile.open(path)
    return ActiveMessage(qid, path, qf, queued_time=0.0)


AHEAD = 32  # a small read-ahead for the property (the daemon's is the core's read cap)


def test_the_read_ahead_covers_any_read_request() -> None:
    assert PREFETCH == READ_BATCH_LIMIT


@settings(max_examples=60, deadline=None)
@given(
    count=st.integers(1, AHEAD + 8),
    done=st.sets(st.integers(0, AHEAD + 8), max_size=6),
    limit=st.integers(1, AHEAD + 10),
)
def test_prefetch_equals_a_read(
    tmp_path_factory: pytest.TempPathFactory, count: int, done: set[int], limit: int
) -> None:
    root = tmp_path_factory.mktemp("spool")
    spool = Spool(root, fsync=False)
    spool.ensure_dirs()
    done = {d for d in done if d < count - 1}  # keep one recipient to deliver
    msg = _message(spool, count, done)
    qf = msg.qf
    loaded = load_queue_file(msg.path, AHEAD)
    assert loaded.qf == qf
    msg.prefetch = ahead = (qf.first_recipient_offset, loaded.recipients, loaded.next_offset)
    request = ReadRequest(
        Message(msg.queue_id, 0.0, count, limit), qf.first_recipient_offset, limit
    )
    got = _from_prefetch(msg, request)
    want = qf.read_recipients(qf.first_recipient_offset, limit)
    assert msg.prefetch is None  # used once
    if got is None:  # only when the request wants more than was read ahead
        assert limit > AHEAD and ahead[2] != 0
    else:
        assert got == want


def _count_read_tasks(monkeypatch: pytest.MonkeyPatch) -> list[ReadRequest]:
    """The read requests answered by ``RecipientReader.read`` (a task each), from now on."""
    reads: list[ReadRequest] = []
    plain_read = RecipientReader.read

    async def counted(self: RecipientReader, request: ReadRequest) -> None:
        reads.append(request)
        await plain_read(self, request)

    monkeypatch.setattr(RecipientReader, "read", counted)
    return reads


async def test_a_read_the_read_ahead_covers_is_answered_in_the_pass(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first read request of a message is answered from the read-ahead by the engine's
    pass itself: no read task, and each file is opened once, by its load (the envelope, the
    recipients and the content of a small message all come from that one read)."""
    agent = FakeAgent()
    engine, spool, clock = create_test_engine(tmp_path, agent)
    reads = _count_read_tasks(monkeypatch)
    opened: list[str] = []
    plain_open = records.open_regular_stat

    def counted_open(path: Path | str, flags: int, mode: int = 0o600) -> object:
        if Path(path).parent.name == "active" and flags & (os.O_WRONLY | os.O_RDWR) == 0:
            opened.append(Path(path).name)
        return plain_open(path, flags, mode)

    monkeypatch.setattr(records, "open_regular_stat", counted_open)
    monkeypatch.setattr(loadread, "open_regular_stat", counted_open)
    qids = [submit(spool, clock, "s@x.test", [f"r{i}@y.test"]) for i in range(3)]
    task = await run_until_idle(engine)
    try:
        assert sorted(q for q, _ in agent.delivered) == sorted(qids)
        assert reads == []
        assert sorted(opened) == sorted(qids)  # one read-only open per message: its load's
    finally:
        await stop_engine(engine, task)


async def test_a_read_beyond_the_read_ahead_still_takes_a_task(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Recipients past the read-ahead are read by a task, as before."""
    agent = FakeAgent()
    engine, spool, clock = create_test_engine(tmp_path, agent)
    monkeypatch.setattr(loading, "PREFETCH", 2)
    reads = _count_read_tasks(monkeypatch)
    rcpts = [f"r{i}@y.test" for i in range(5)]
    qid = submit(spool, clock, "s@x.test", rcpts)
    task = await run_until_idle(engine)
    try:
        assert sorted(a for q, a in agent.delivered if q == qid) == sorted(rcpts)
        assert reads
    finally:
        await stop_engine(engine, task)
