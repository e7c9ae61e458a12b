"""A small message's content is read once for all its deliveries in flight (``SharedReads``)."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from qmgrd.daemon import table as table_module
from qmgrd.daemon.sharedread import SHARE_LIMIT, SharedReads
from qmgrd.daemon.table import ActiveMessage
from qmgrd.delivery.transaction import CONTENT_CHUNK
from qmgrd.errors import InvariantError
from qmgrd.spool import Envelope, QueueFile, RecipientSpec, Spool
from qmgrd.spool import content as content_module
from qmgrd.spool.records import QueueFileIOError
from tests.support.agents import stalled_agent
from tests.support.engine import create_test_engine, stop_engine, submit
from tests.support.waits import TIMEOUT


def _message(root: Path, body: bytes) -> ActiveMessage:
    spool = Spool(root, fsync=False)
    spool.ensure_dirs()
    envelope = Envelope(
        sender="s@x.test",
        recipients=(RecipientSpec("a@y.test"), RecipientSpec("b@z.test")),
        arrival_time=1_000_000_000.0,
    )
    qid = spool.commit(envelope, body)
    path = spool.path("incoming", qid)
    return ActiveMessage(qid, path, QueueFile.open(path), queued_time=0.0)


class Thread:
    """A submit that runs each job in a thread and counts the jobs; ``gate`` holds them."""

    def __init__(self) -> None:
        self.jobs = 0
        self.gate = asyncio.Event()
        self.gate.set()

    async def __call__(self, fn: Callable[[], Any]) -> Any:
        self.jobs += 1
        await self.gate.wait()
        return await asyncio.to_thread(fn)


async def _read_all(content: Any) -> bytes:
    return b"".join([chunk async for chunk in content.chunks(CONTENT_CHUNK)])


async def _race(
    reads: SharedReads, msg: ActiveMessage, submit: Thread, count: int, *, cancel_first: bool
) -> list[Any]:
    """``count`` deliveries read at once while the first read is held; their results."""
    contents = [reads.content(msg) for _ in range(count)]
    submit.gate.clear()
    tasks = [asyncio.create_task(_read_all(c)) for c in contents]
    await asyncio.sleep(0)
    if cancel_first:
        tasks[0].cancel()
        await asyncio.sleep(0)
    submit.gate.set()
    return await asyncio.gather(*tasks, return_exceptions=True)


async def test_concurrent_deliveries_share_one_read(tmp_path: Path) -> None:
    body = b"Subject: x\r\n\r\n" + b"y" * 2000 + b"\r\n"
    msg = _message(tmp_path, body)
    submit = Thread()
    reads = SharedReads(submit)
    contents = [reads.content(msg) for _ in range(10)]
    submit.gate.clear()  # the first read waits, the others queue behind it
    tasks = [asyncio.create_task(_read_all(c)) for c in contents]
    await asyncio.sleep(0)
    submit.gate.set()
    assert await asyncio.gather(*tasks) == [body] * 10
    assert submit.jobs == 1
    later = reads.content(msg)
    assert await _read_all(later) == body  # a later delivery: no read at all
    assert submit.jobs == 1
    for content in [*contents, later]:
        reads.release(msg, content)
    assert len(reads) == 0  # the bytes went with the last delivery


async def test_a_new_pass_reads_again(tmp_path: Path) -> None:
    msg = _message(tmp_path, b"body\r\n")
    submit = Thread()
    reads = SharedReads(submit)
    first = reads.content(msg)
    assert await _read_all(first) == b"body\r\n"
    reads.release(msg, first)
    assert await _read_all(reads.content(msg)) == b"body\r\n"
    assert submit.jobs == 2


async def test_large_content_is_not_shared_nor_counted(tmp_path: Path) -> None:
    body = b"z" * (SHARE_LIMIT + 1)
    msg = _message(tmp_path, body)
    submit = Thread()
    reads = SharedReads(submit)
    contents = [reads.content(msg) for _ in range(3)]
    assert len(reads) == 0
    assert [await _read_all(c) for c in contents] == [body] * 3
    assert submit.jobs == 3
    reads.release(msg, contents[0])  # nothing counted, nothing to release: no error


async def test_a_failed_read_is_reported_by_every_delivery(tmp_path: Path) -> None:
    msg = _message(tmp_path, b"body\r\n")
    os.unlink(msg.path)
    submit = Thread()
    results = await _race(SharedReads(submit), msg, submit, 3, cancel_first=False)
    assert all(isinstance(r, QueueFileIOError) for r in results), results
    assert submit.jobs == 3  # nothing shared: each delivery read (and failed) for itself


async def test_a_cancelled_first_reader_leaves_the_others_reading(tmp_path: Path) -> None:
    msg = _message(tmp_path, b"body\r\n")
    submit = Thread()
    results = await _race(SharedReads(submit), msg, submit, 3, cancel_first=True)
    assert isinstance(results[0], asyncio.CancelledError)
    assert results[1:] == [b"body\r\n", b"body\r\n"]


def test_releasing_more_than_handed_out_is_a_bug(tmp_path: Path) -> None:
    msg = _message(tmp_path, b"body\r\n")
    reads = SharedReads(Thread())
    content = reads.content(msg)
    reads.release(msg, content)
    with pytest.raises(InvariantError):
        reads.release(msg, content)


async def test_content_the_load_holds_is_neither_read_nor_counted(tmp_path: Path) -> None:
    msg = _message(tmp_path, b"body\r\n")
    msg.content = b"body\r\n"
    submit = Thread()
    reads = SharedReads(submit)
    content = reads.content(msg)
    assert len(reads) == 0
    assert await _read_all(content) == b"body\r\n"
    assert submit.jobs == 0
    reads.release(msg, content)


async def test_an_engine_reads_a_message_once_for_its_destinations(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Three destinations, three deliveries in flight at once, the load's content budget
    spent: one read of the queue file, the same content for each agent call, nothing held
    once they are done."""
    monkeypatch.setattr(table_module, "CONTENT_HELD", 0)  # the load holds no content
    opened: list[Path] = []
    plain = content_module._open_and_read

    def counted(path: Path, want: int, offset: int, whole: bool) -> tuple[int, bytes]:
        opened.append(path)
        return plain(path, want, offset, whole)

    monkeypatch.setattr(content_module, "_open_and_read", counted)
    agent = stalled_agent()
    engine, spool, clock = create_test_engine(tmp_path, agent)
    submit(spool, clock, "s@src.test", ["r@a.test", "r@b.test", "r@c.test"])
    task = asyncio.create_task(engine.run())
    await agent.wait_started(3)
    agent.release()
    await asyncio.wait_for(engine.wait_idle(), TIMEOUT)
    await stop_engine(engine, task)
    assert len(agent.requests) == 3
    assert len(set(agent.contents)) == 1
    assert len(opened) == 1
    assert len(engine.dispatcher.reads) == 0
