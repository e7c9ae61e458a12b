"""The group commit: last writes on the loop, fsyncs and links in one hop, in commit order."""

from __future__ import annotations

import asyncio
import gc
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest

from qmgrd.errors import SpoolError
from qmgrd.spool import QueueFile, RecipientSpec, Spool
from qmgrd.spool.commit import GroupCommitter, commit_writers
from qmgrd.spool.writer import EnvelopeHead, QueueFileWriter

T = TypeVar("T")
HEAD = EnvelopeHead(sender="s@x.test", arrival_time=1_000_000_000.0)


class ThreadRunner:
    """A BlockingRunner that runs each job in a fresh thread and records what it was."""

    def __init__(self) -> None:
        self.jobs: list[str] = []

    async def run(self, fn: Callable[[], T], *, blocking: bool = True) -> T:
        inner = getattr(fn, "func", fn)
        self.jobs.append(getattr(inner, "__name__", repr(inner)))
        return await asyncio.to_thread(fn)


@pytest.fixture
def spool(tmp_path: Path) -> Spool:
    s = Spool(tmp_path / "spool")
    s.ensure_dirs()
    return s


def _writer(spool: Spool, body: bytes) -> QueueFileWriter:
    writer = QueueFileWriter(spool, HEAD)
    writer.add_recipient(RecipientSpec("r@y.test"))
    writer.begin_content()
    writer.add_content(body)
    return writer


async def test_writes_on_the_loop_one_hop_for_fsyncs_and_links_in_commit_order(
    spool: Spool, monkeypatch: pytest.MonkeyPatch
) -> None:
    loop_thread = threading.get_ident()
    events: list[tuple[str, bool]] = []  # (what, on the loop thread)
    real_fsync, real_link, real_writev = os.fsync, os.link, os.writev

    def fsync(fd: int) -> None:
        what = "dir fsync" if os.path.isdir(f"/proc/self/fd/{fd}") else "file fsync"
        events.append((what, threading.get_ident() == loop_thread))
        real_fsync(fd)

    def link(src: str, dst: str) -> None:
        events.append(("link", threading.get_ident() == loop_thread))
        real_link(src, dst)

    def writev(fd: int, buffers: list[memoryview]) -> int:
        events.append(("write", threading.get_ident() == loop_thread))
        return real_writev(fd, buffers)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "link", link)
    monkeypatch.setattr(os, "writev", writev)
    runner = ThreadRunner()
    committer = GroupCommitter(spool, pool=runner, syncfs_dirty_limit=0)
    writers = [_writer(spool, b"body %d\n" % i) for i in range(5)]
    ids = await asyncio.gather(*(committer.commit_writer(w) for w in writers))
    await committer.close()

    assert set(ids) == set(spool.list_ids("incoming"))
    assert not [n for n in os.listdir(spool.root / "incoming") if n.startswith(".")]
    for qid in ids:
        assert QueueFile.open(spool.path("incoming", qid)).content_size == len(b"body 0\n")
    assert runner.jobs == ["commit_writers"]  # one hop for the batch
    assert all(on_loop for what, on_loop in events if what == "write")
    assert not any(on_loop for what, on_loop in events if what != "write")
    # Each file: written, fsynced, linked; then the directory fsync, once.
    kinds = [what for what, _ in events]
    assert kinds == ["write"] * 5 + ["file fsync", "link"] * 5 + ["dir fsync"]


async def test_a_failed_file_fsync_fails_only_its_message_and_leaves_nothing(
    spool: Spool, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_fsync = os.fsync
    bad = _writer(spool, b"bad\n")
    bad_fd: list[int] = []

    def fsync(fd: int) -> None:
        if bad_fd and fd == bad_fd[0]:
            bad_fd.clear()  # once: the number is free for reuse after the discard
            raise OSError(5, "Input/output error")
        real_fsync(fd)

    real_finish = QueueFileWriter.finish

    def finish(self: QueueFileWriter) -> None:
        real_finish(self)
        if self is bad:
            bad_fd.append(self._fd)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(QueueFileWriter, "finish", finish)
    committer = GroupCommitter(spool, pool=ThreadRunner(), syncfs_dirty_limit=0)
    good = _writer(spool, b"good\n")
    results = await asyncio.gather(
        committer.commit_writer(bad), committer.commit_writer(good), return_exceptions=True
    )
    await committer.close()
    assert isinstance(results[0], SpoolError)
    assert isinstance(results[1], str)
    assert os.listdir(spool.root / "incoming") == [results[1]]


class GateRunner:
    """A BlockingRunner whose hops wait for ``gate``; it records the most hops at once."""

    def __init__(self) -> None:
        self.gate = asyncio.Event()
        self.in_flight = 0
        self.most = 0
        self.waiting = asyncio.Event()

    async def run(self, fn: Callable[[], T], *, blocking: bool = True) -> T:
        self.in_flight += 1
        self.most = max(self.most, self.in_flight)
        self.waiting.set()
        try:
            await self.gate.wait()
            return await asyncio.to_thread(fn)
        finally:
            self.in_flight -= 1


@pytest.mark.parametrize("flights", [1, 3])
async def test_batches_go_to_disk_concurrently_up_to_max_flights(
    spool: Spool, flights: int
) -> None:
    """While batches are on disk, commits that waited ``stall`` (0 here) start more batches up
    to ``max_flights``; the rest wait for the next batch, and every message lands once."""
    runner = GateRunner()
    committer = GroupCommitter(spool, pool=runner, max_flights=flights, stall=0)
    pending: list[asyncio.Task[str]] = []
    for i in range(6):  # one commit per loop pass, each after the previous batch left
        runner.waiting.clear()
        pending.append(asyncio.create_task(committer.commit_writer(_writer(spool, b"%d\n" % i))))
        if i < flights:  # a new batch goes to disk at once
            await asyncio.wait_for(runner.waiting.wait(), 5)
        for _ in range(3):
            await asyncio.sleep(0)
    assert runner.in_flight == flights
    runner.gate.set()
    ids = await asyncio.wait_for(asyncio.gather(*pending), 10)
    await committer.close()
    assert runner.most == flights
    assert len(set(ids)) == 6 and set(ids) == set(spool.list_ids("incoming"))


async def test_a_commit_waits_for_the_batch_on_disk_until_it_has_stalled(spool: Spool) -> None:
    """Before ``stall`` has passed, commits queue behind the batch on disk (one flight, one
    hop for all of them); the first commit of an idle committer goes to disk at once."""
    runner = GateRunner()
    committer = GroupCommitter(spool, pool=runner, max_flights=4, stall=60)
    first = asyncio.create_task(committer.commit_writer(_writer(spool, b"first\n")))
    await asyncio.wait_for(runner.waiting.wait(), 5)
    later = [
        asyncio.create_task(committer.commit_writer(_writer(spool, b"%d\n" % i))) for i in range(3)
    ]
    for _ in range(5):
        await asyncio.sleep(0)
    assert runner.in_flight == 1
    runner.gate.set()
    ids = await asyncio.wait_for(asyncio.gather(first, *later), 10)
    await committer.close()
    assert runner.most == 1
    assert set(ids) == set(spool.list_ids("incoming")) and len(set(ids)) == 4


async def test_the_hop_makes_only_fsyncs_and_links_the_loop_closes_and_unlinks(
    spool: Spool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In the worker thread: each file's fsync and link, the directory's fsync on a descriptor
    opened once for every batch; each file's close and temporary name go on the loop."""
    loop_thread = threading.get_ident()
    calls: list[tuple[str, bool]] = []  # (call, on the loop thread)

    def spy(name: str) -> None:
        real = getattr(os, name)

        def call(*args: object, **kwargs: object) -> object:
            calls.append((name, threading.get_ident() == loop_thread))
            return real(*args, **kwargs)

        monkeypatch.setattr(os, name, call)

    for name in ("fsync", "link", "unlink", "close", "open"):
        spy(name)
    committer = GroupCommitter(spool, pool=ThreadRunner(), syncfs_dirty_limit=0)
    first = await committer.commit_writer(_writer(spool, b"one\n"))
    second = await committer.commit_writer(_writer(spool, b"two\n"))
    in_thread = [name for name, on_loop in calls if not on_loop]
    on_loop = [name for name, on_loop in calls if on_loop]
    await committer.close()
    # file fsync, link, directory fsync (+ the directory's one open, first batch only)
    assert in_thread == ["fsync", "link", "open", "fsync", "fsync", "link", "fsync"]
    assert on_loop.count("unlink") == 2 and on_loop.count("close") == 2
    assert sorted(os.listdir(spool.root / "incoming")) == sorted([first, second])  # no temp


async def test_a_failed_directory_fsync_leaves_neither_name(
    spool: Spool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The directory fsync fails: the message is refused, its final and temporary names go."""
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        if os.path.isdir(f"/proc/self/fd/{fd}"):
            raise OSError(5, "Input/output error")
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    committer = GroupCommitter(spool, pool=ThreadRunner())
    with pytest.raises(SpoolError, match="queue directory sync error"):
        await committer.commit_writer(_writer(spool, b"lost\n"))
    await committer.close()
    assert os.listdir(spool.root / "incoming") == []


async def test_without_a_pool_hops_run_on_the_committers_own_threads_which_end_at_close(
    spool: Spool,
) -> None:
    """No pool: each hop runs on a long-lived thread of the committer's (one per flight at
    most); they are gone after close."""
    hop_threads: set[threading.Thread] = set()
    real = commit_writers

    def spy(*args: Any, **kwargs: Any) -> list[str | SpoolError]:
        hop_threads.add(threading.current_thread())
        return real(*args, **kwargs)

    committer = GroupCommitter(spool, max_flights=2, stall=0)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("qmgrd.spool.commit.commit_writers", spy)
        ids = await asyncio.gather(
            *(committer.commit_writer(_writer(spool, b"%d\n" % i)) for i in range(8))
        )
        await committer.close()
    assert set(ids) == set(spool.list_ids("incoming")) and len(ids) == 8
    assert hop_threads and {t.name for t in hop_threads} == {"qmgrd-commit"}
    assert len(hop_threads) <= 2  # one per flight at most
    assert threading.current_thread() not in hop_threads
    for _ in range(200):  # bounded: the threads take their end marker at once
        if not any(t.is_alive() for t in hop_threads):
            break
        await asyncio.sleep(0.01)
    assert not any(t.is_alive() for t in hop_threads)


async def test_an_exception_in_a_hop_reaches_the_flusher_as_a_spool_error(spool: Spool) -> None:
    """A bug in the hop (here: commit_writers raises) fails that batch's commits, loudly typed."""

    def broken(*args: Any, **kwargs: Any) -> list[str | SpoolError]:
        raise RuntimeError("boom")

    committer = GroupCommitter(spool)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("qmgrd.spool.commit.commit_writers", broken)
        with pytest.raises(SpoolError, match="boom"):
            await committer.commit_writer(_writer(spool, b"x\n"))
        await committer.close()


def test_a_crash_between_the_hop_and_the_release_leaves_the_message_whole(spool: Spool) -> None:
    """Published in the hop, never released (the process died): start-up's temporary cleanup
    leaves exactly the committed file, which reads back whole."""
    writer = _writer(spool, b"survivor\n")
    writer.finish()
    (result,) = commit_writers(spool, [writer], keep_open=True)
    assert isinstance(result, str)
    assert sorted(os.listdir(spool.root / "incoming")) == sorted([result, "." + result])
    os.close(writer._fd)  # what the process's death does; no release
    assert spool.remove_temp_files() == 1
    assert os.listdir(spool.root / "incoming") == [result]
    assert QueueFile.open(spool.path("incoming", result)).content_size == len(b"survivor\n")


async def test_a_committer_dropped_without_close_ends_its_threads(spool: Spool) -> None:
    """Garbage collection of a committer nobody closed ends its hop threads."""
    committer = GroupCommitter(spool)
    await committer.commit_writer(_writer(spool, b"x\n"))
    threads = list(committer._hops._threads)  # this committer's, not other tests' leftovers
    del committer
    gc.collect()
    for _ in range(200):  # bounded
        if not any(t.is_alive() for t in threads):
            break
        await asyncio.sleep(0.01)
    assert threads and not any(t.is_alive() for t in threads)
