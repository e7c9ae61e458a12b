"""Group commit: many SMTP sessions' messages made durable by one worker-thread pass.

Theory of operation
-------------------
Each accepted message needs its file fsynced and a directory fsync after the
link into incoming/. Done one by one, the directory fsyncs (a journal commit
each) dominate intake. The committer instead queues requests from every
session; a flusher task hands everything queued so far to a worker thread
as one batch (write + fsync each file, then one directory fsync for all).
While a batch is on disk, new requests accumulate for the next one, so
under load the batch size grows by itself, and an idle daemon still commits
a lone message at once (no added latency). When a request has waited
``stall`` seconds (default 5 ms) behind batches still on disk, another
flusher starts, up to ``max_flights`` batches on disk at once (default 4):
the fsyncs of one batch run one after the other, while a disk completes
concurrent fsyncs together — on this project's test machine 100 KB files
were made durable 2-4 times faster from 8 threads than from one. Fast
commits (small messages) stay in one flight and pay one thread hop per
batch; slow ones (big messages, a busy disk) spread over several.

Two kinds of request share the batches: a ``QueueFileWriter`` the listener
filled while the message arrived (``commit_writer``; see
``qmgrd.spool.writer``), and a whole message in memory (``commit``, for
callers that have one; it goes through ``Spool.commit_batch``).

At most ``max_batch`` messages go in one batch, bounding the latency of the
first message in it. The event loop never waits for an fsync. A batch of
writers is committed in two steps: on the loop each writer's last bytes go
to the page cache (``finish``: the open and the write a worker thread would
pay a GIL hand-off for each, since the loop holds the lock while busy); then
one thread hop fsyncs and links each file and fsyncs the queue directories
once (``commit_writers``), so a message costs the session one hop as before.
Every system call in that hop hands the interpreter lock back and forth with
the busy loop (a futex wake-up and a context switch on each side), so the hop
makes only the ones that must sit between the two fsyncs: the file's fsync
and its link; and where the spool's file system allows it and little else is
dirty, the files' fsyncs are one ``syncfs`` for the whole batch
(``qmgrd.spool.batchsync``: a write, an inode write and a cache flush per file
become one submission and one flush). The directories' descriptors stay open (``QueueDirectories``),
and each file's close and the unlink of its temporary name run on the loop
after the hop (``QueueFileWriter.release``).
A batch holding a whole message or a REDIRECT that must rebuild its file
goes to that hop as a whole (``_commit_batch``).
Hops run on the ``pool`` given (the daemon's regulated
``qmgrd.daemon.workpool.WorkPool``, which adds a thread while every worker is
blocked in fsync), else on the committer's own threads (``_Hops``): long-lived,
one per flight at most, fed through a ``SimpleQueue`` and answering with one
``call_soon_threadsafe`` per hop (no executor future, work item, context copy
or chained future per hop, as ``asyncio.to_thread`` makes).

Why the file's sync is ``fsync`` and not ``fdatasync``: ``fdatasync`` writes
the data and the inode fields needed to read it back (size, block map) and
skips only a change of the timestamps alone; on ext4 without a journal both
write the inode block that the size change dirtied (through the inode's
buffer list), so for a pooled file rewritten and cut to a new length, or a new
file, the two do the same disk work but for the timestamps. Neither makes a
name durable: the directory fsync after the link does. Measured with
``bench/syncmicro.py`` (2026-11-26, load 10-11): 63-109 us CPU per fsync
against 66-90 per fdatasync, within the noise; not worth a second rule.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import queue
import threading
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from qmgrd.errors import InvariantError, SpoolError
from qmgrd.spool.batchsync import DEFAULT_DIRTY_LIMIT, BatchSync
from qmgrd.spool.diskio import QueueDirectories, sync_directories
from qmgrd.spool.records import Envelope
from qmgrd.spool.store import Spool
from qmgrd.spool.writer import QueueFileWriter

_T = TypeVar("_T")


class BlockingRunner(Protocol):
    """Where blocking work runs (``qmgrd.daemon.workpool.WorkPool`` satisfies it)."""

    async def run(self, fn: Callable[[], _T], *, blocking: bool = True) -> _T:
        """Run ``fn`` in a worker thread and return its result."""
        ...


@dataclass(slots=True, eq=False)
class _Request:
    item: QueueFileWriter | tuple[Envelope, bytes]
    future: asyncio.Future[str]


class GroupCommitter:
    """Async front of the batch commits; one per daemon (up to ``max_flights`` flusher tasks)."""

    __slots__ = (
        "__weakref__",
        "_batch_sync",
        "_closed",
        "_dirs",
        "_flushers",
        "_hops",
        "_pending",
        "_starting",
        "_timer",
        "max_batch",
        "max_flights",
        "pool",
        "spool",
        "stall",
    )

    def __init__(
        self,
        spool: Spool,
        *,
        max_batch: int = 64,
        max_flights: int = 4,
        stall: float = 0.005,
        pool: BlockingRunner | None = None,
        syncfs_dirty_limit: int = DEFAULT_DIRTY_LIMIT,
    ) -> None:
        if max_batch < 1 or max_flights < 1 or stall < 0:
            raise InvariantError(f"max_batch {max_batch}, max_flights {max_flights}, stall {stall}")
        self.spool = spool
        self.pool = pool
        self.max_batch = max_batch
        self.max_flights = max_flights
        self.stall = stall
        self._timer: asyncio.TimerHandle | None = None  # the next stall check, if any
        self._pending: list[_Request] = []
        self._flushers: set[asyncio.Task[None]] = set()
        self._starting = 0  # flushers created that have not taken their first batch yet
        self._closed = False
        self._dirs = QueueDirectories(str(spool.root))  # directory fsyncs: opened once
        # queue_syncfs_dirty_limit: one syncfs per batch while little else is dirty
        self._batch_sync = BatchSync(str(spool.root), syncfs_dirty_limit if spool.fsync else 0)
        self._hops = _Hops()  # where hops run without a pool
        # A committer dropped without close (a test's) still ends its threads and descriptors.
        weakref.finalize(self, self._hops.close)
        weakref.finalize(self, self._dirs.close)
        weakref.finalize(self, self._batch_sync.close)

    @property
    def batch_sync(self) -> BatchSync:
        """How writer batches are made durable, and how many went each way."""
        return self._batch_sync

    async def commit(self, envelope: Envelope, content: bytes) -> str:
        """Durably store a message; returns its queue id, raises SpoolError on failure."""
        return await self._submit((envelope, content))

    async def commit_writer(self, writer: QueueFileWriter) -> str:
        """Finish and durably store a message written as it arrived; SpoolError on failure.

        On failure the writer's temporary file is gone. On cancellation of the
        caller the commit still completes (the message lands, unacknowledged).
        """
        return await self._submit(writer)

    async def _submit(self, item: QueueFileWriter | tuple[Envelope, bytes]) -> str:
        if self._closed:
            if isinstance(item, QueueFileWriter):
                await asyncio.to_thread(item.discard)
            raise SpoolError("queue file write error: the daemon is shutting down")
        future: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        # Retrieve the outcome even if the session went away meanwhile (no "never retrieved").
        future.add_done_callback(_consume)
        self._pending.append(_Request(item, future))
        if not self._flushers:
            self._start_flusher()
        elif self._timer is None and len(self._flushers) < self.max_flights:
            self._timer = future.get_loop().call_later(self.stall, self._stalled)
        # A caller cancelled meanwhile cancels only this future: the item stays in its
        # batch and is committed all the same (``_flush`` skips a future already done).
        return await future

    def _start_flusher(self) -> None:
        self._starting += 1
        flusher = asyncio.create_task(self._flush())
        self._flushers.add(flusher)
        flusher.add_done_callback(self._flushers.discard)

    def _stalled(self) -> None:
        """A request waited ``stall`` behind the batches on disk: one more flight."""
        self._timer = None
        if self._pending and not self._starting and len(self._flushers) < self.max_flights:
            self._start_flusher()

    async def _flush(self) -> None:
        self._starting -= 1
        while self._pending:
            batch = self._pending[: self.max_batch]
            del self._pending[: self.max_batch]
            try:
                writers = [r.item for r in batch if isinstance(r.item, QueueFileWriter)]
                if len(writers) == len(batch) and not any(w.needs_rebuild for w in writers):
                    results = await self._staged(writers)
                else:
                    results = await self._run(functools.partial(self._commit_batch, batch))
            except Exception as exc:  # a bug or an unexpected error: fail the batch
                failure = SpoolError(f"queue file write error: {exc}")
                results = [failure for _ in batch]
            for request, result in zip(batch, results, strict=True):
                if request.future.done():
                    continue
                if isinstance(result, str):
                    request.future.set_result(result)
                else:
                    request.future.set_exception(result)

    async def _run(self, fn: Callable[[], _T]) -> _T:
        if self.pool is not None:
            return await self.pool.run(fn)
        return await self._hops.run(fn)

    async def _staged(self, writers: list[QueueFileWriter]) -> list[str | SpoolError]:
        """Commit writers: the last writes on the loop, the rest in one hop (module doc)."""
        results: list[str | SpoolError | None] = []
        for writer in writers:  # on the loop: page-cache writes
            try:
                writer.finish()
                results.append(None)
            except SpoolError as exc:
                results.append(exc)
        live = [w for w, r in zip(writers, results, strict=True) if r is None]
        if live:
            # One hop: fsync (or one syncfs for all) and link each file, fsync each queue
            # directory once; the files are closed and their temporary names unlinked
            # here, on the loop.
            whole_fs = self._batch_sync.whole_fs()
            hop = functools.partial(
                commit_writers,
                self.spool,
                live,
                dirs=self._dirs,
                keep_open=True,
                batch_sync=self._batch_sync if whole_fs else None,
            )
            try:
                done = iter(await self._run(hop))
            finally:
                for writer in live:
                    writer.release()
            results = [next(done) if r is None else r for r in results]
        return [r for r in results if r is not None]

    def _commit_batch(self, batch: list[_Request]) -> list[str | SpoolError]:
        """Worker thread: writers in one pass, whole messages in another; results in order."""
        writers = [r.item for r in batch if isinstance(r.item, QueueFileWriter)]
        whole = [r.item for r in batch if not isinstance(r.item, QueueFileWriter)]
        done_writers = iter(commit_writers(self.spool, writers) if writers else [])
        done_whole = iter(self.spool.commit_batch(whole) if whole else [])
        return [
            next(done_writers) if isinstance(r.item, QueueFileWriter) else next(done_whole)
            for r in batch
        ]

    async def close(self) -> None:
        """Refuse new requests and wait until every queued one has been committed."""
        self._closed = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        while self._flushers:
            await asyncio.shield(asyncio.gather(*self._flushers))
        self._hops.close()
        self._dirs.close()
        self._batch_sync.close()


class _Hops:
    """The committer's worker threads (module doc): a new one only while all are busy.

    Every count is kept on the loop's thread; the threads only take jobs and
    hand back results. At most one job per flight is out at once, so there are
    at most ``max_flights`` threads. ``close`` ends them once idle.
    """

    __slots__ = ("_busy", "_jobs", "_threads")

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._busy = 0  # jobs handed out and not answered yet

    async def run(self, fn: Callable[[], _T]) -> _T:
        """Run ``fn`` in one of the threads; its result (or exception)."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[_T] = loop.create_future()
        if self._busy >= len(self._threads):
            thread = threading.Thread(
                target=self._work, name="qmgrd-commit", daemon=True  # a hop never outlives us
            )
            thread.start()
            self._threads.append(thread)
        self._busy += 1
        self._jobs.put(_Job(fn, future, loop))
        try:
            return await future
        finally:
            self._busy -= 1

    def _work(self) -> None:
        while (job := self._jobs.get()) is not None:
            try:
                result, error = job.fn(), None
            except BaseException as exc:  # handed to the awaiting flusher as it is
                result, error = None, exc
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                job.loop.call_soon_threadsafe(_settle, job.future, result, error)

    def close(self) -> None:
        """End the threads once they are idle (they take nothing after this)."""
        for _ in self._threads:
            self._jobs.put(None)
        self._threads.clear()


@dataclass(slots=True, eq=False)
class _Job:
    fn: Callable[[], Any]
    future: asyncio.Future[Any]
    loop: asyncio.AbstractEventLoop


def _settle(future: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    if future.done():  # the flusher was cancelled
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)


def _consume(future: asyncio.Future[str]) -> None:
    if not future.cancelled():
        future.exception()


def commit_writers(
    spool: Spool,
    writers: Sequence[QueueFileWriter],
    *,
    dirs: QueueDirectories | None = None,
    keep_open: bool = False,
    batch_sync: BatchSync | None = None,
) -> list[str | SpoolError]:
    """Commit several writers with one fsync per target directory; a result per writer.

    A failed directory fsync fails (and unlinks) every item: none of them was
    acknowledged, so none may stay where the queue manager would find it.
    ``dirs``: the directories' descriptors, kept open; ``keep_open``: each
    file's close and temporary name are left to the caller's
    ``QueueFileWriter.release`` (writers already ``finish``ed). ``batch_sync``
    (with ``keep_open`` only): one syncfs of the file system instead of each
    file's fsync; if it fails, every file is discarded and fails (and after
    that failure, batches handed one fsync each file: ``BatchSync.sync``).
    """
    results: list[str | SpoolError] = []
    synced = False  # the files' data and inodes are durable already (one syncfs)
    if batch_sync is not None and keep_open:
        try:
            synced = batch_sync.sync()  # False: an earlier syncfs failed, fsync each
        except OSError as exc:
            failed = SpoolError(f"queue file write error: {exc.strerror or exc}")
            for writer in writers:
                writer.discard()
            return [failed for _ in writers]
    for writer in writers:
        try:
            if keep_open:
                if not synced:
                    writer.sync()
                results.append(writer.publish(keep_open=True))
            else:
                results.append(writer.commit())
        except SpoolError as exc:
            results.append(exc)
    committed = [
        (writer.target, r) for writer, r in zip(writers, results, strict=True) if isinstance(r, str)
    ]
    error = sync_directories(spool, committed, dirs)
    return results if error is None else [error for _ in results]
