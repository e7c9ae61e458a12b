"""One syncfs per commit batch while little is dirty, an fsync per file otherwise."""

from __future__ import annotations

import asyncio
import ctypes
import errno
import os
import threading
from pathlib import Path

import pytest

from qmgrd.config.params import PARAMS
from qmgrd.errors import SpoolError
from qmgrd.spool import QueueFile, RecipientSpec, Spool
from qmgrd.spool.batchsync import DEFAULT_DIRTY_LIMIT, BatchSync, syncfs_reports_errors
from qmgrd.spool.commit import GroupCommitter, commit_writers
from qmgrd.spool.writer import EnvelopeHead, QueueFileWriter

HEAD = EnvelopeHead(sender="s@x.test", arrival_time=1_000_000_000.0)
NEW_KERNEL = ("Linux", "6.1.0-13-amd64")
HERE = os.uname()
SYNCFS_HERE = syncfs_reports_errors(HERE.sysname, HERE.release)
EVERYTHING = 1 << 62  # a limit no machine's dirty page cache reaches


def _meminfo(path: Path, dirty_kb: int, writeback_kb: int = 0) -> str:
    path.write_text(
        "MemTotal:       24683356 kB\nMemFree:        23072936 kB\n"
        f"Dirty:          {dirty_kb:>8} kB\nWriteback:      {writeback_kb:>8} kB\n"
        "AnonPages:        301636 kB\n"
    )
    return str(path)


def _writer(spool: Spool, body: bytes) -> QueueFileWriter:
    writer = QueueFileWriter(spool, HEAD)
    writer.add_recipient(RecipientSpec("r@y.test"))
    writer.begin_content()
    writer.add_content(body)
    return writer


@pytest.mark.parametrize(
    ("sysname", "release", "reports"),
    [
        ("Linux", "5.8.0", True),
        ("Linux", "6.18.44-fc-v769", True),
        ("Linux", "5.10.0-28-amd64", True),
        ("Linux", "5.7.19", False),
        ("Linux", "4.19.0-26-amd64", False),
        ("Linux", "weird", False),
        ("Darwin", "23.1.0", False),
    ],
)
def test_syncfs_only_where_the_kernel_reports_write_back_errors(
    sysname: str, release: str, reports: bool
) -> None:
    assert syncfs_reports_errors(sysname, release) is reports


def test_the_parameter_default_is_the_committers(tmp_path: Path) -> None:
    assert int(PARAMS["queue_syncfs_dirty_limit"].default) == DEFAULT_DIRTY_LIMIT


@pytest.mark.parametrize(
    ("dirty_kb", "writeback_kb", "limit", "whole_fs"),
    [
        (100, 0, 1 << 20, True),
        (1024, 0, 1 << 20, True),  # exactly the limit
        (1000, 25, 1 << 20, False),  # Dirty + Writeback above it
        (1025, 0, 1 << 20, False),
        (0, 0, 0, False),  # 0: always an fsync per file
    ],
)
def test_the_dirty_page_cache_decides_each_batch(
    tmp_path: Path, dirty_kb: int, writeback_kb: int, limit: int, whole_fs: bool
) -> None:
    meminfo = _meminfo(tmp_path / "meminfo", dirty_kb, writeback_kb)
    sync = BatchSync(str(tmp_path), limit, meminfo=meminfo, uname=NEW_KERNEL)
    try:
        assert sync.whole_fs() is whole_fs
        assert (sync.syncfs_batches, sync.fsync_batches) == ((1, 0) if whole_fs else (0, 1))
    finally:
        sync.close()


def test_the_gauge_is_read_again_for_every_batch(tmp_path: Path) -> None:
    path = tmp_path / "meminfo"
    sync = BatchSync(str(tmp_path), 1 << 20, meminfo=_meminfo(path, 10), uname=NEW_KERNEL)
    try:
        assert sync.whole_fs()
        _meminfo(path, 900_000)  # someone dirtied 900 MB meanwhile
        assert not sync.whole_fs()
        _meminfo(path, 12)
        assert sync.whole_fs()
        assert (sync.syncfs_batches, sync.fsync_batches) == (2, 1)
    finally:
        sync.close()


@pytest.mark.parametrize(
    "how", ["old kernel", "no meminfo", "meminfo without Dirty", "not a directory"]
)
def test_anything_unknown_means_an_fsync_per_file(tmp_path: Path, how: str) -> None:
    meminfo = _meminfo(tmp_path / "meminfo", 10)
    uname, root = NEW_KERNEL, str(tmp_path)
    if how == "old kernel":
        uname = ("Linux", "5.4.0-150-generic")
    elif how == "no meminfo":
        meminfo = str(tmp_path / "absent")
    elif how == "meminfo without Dirty":
        Path(meminfo).write_text("MemTotal: 1 kB\nWriteback: 0 kB\n")
    else:
        root = meminfo  # the spool's root cannot be opened as a directory
    sync = BatchSync(root, EVERYTHING, meminfo=meminfo, uname=uname)
    try:
        assert not sync.whole_fs()
        if how != "meminfo without Dirty":  # (there only the gauge is unreadable)
            with pytest.raises(OSError):
                sync.sync()
    finally:
        sync.close()


@pytest.mark.skipif(not SYNCFS_HERE, reason="syncfs does not report errors on this kernel")
async def test_a_batch_is_one_syncfs_then_the_links_then_one_directory_fsync(
    spool: Spool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the limit out of reach: no file fsync at all, one syncfs before the links."""
    loop_thread = threading.get_ident()
    events: list[tuple[str, bool]] = []  # (what, on the loop thread)
    real_fsync, real_link, real_sync = os.fsync, os.link, BatchSync.sync

    def fsync(fd: int) -> None:
        what = "dir fsync" if os.path.isdir(f"/proc/self/fd/{fd}") else "file fsync"
        events.append((what, threading.get_ident() == loop_thread))
        real_fsync(fd)

    def link(src: str, dst: str) -> None:
        events.append(("link", threading.get_ident() == loop_thread))
        real_link(src, dst)

    def syncfs(self: BatchSync) -> bool:
        events.append(("syncfs", threading.get_ident() == loop_thread))
        return real_sync(self)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "link", link)
    monkeypatch.setattr(BatchSync, "sync", syncfs)
    committer = GroupCommitter(spool, syncfs_dirty_limit=EVERYTHING)
    writers = [_writer(spool, b"body %d\n" % i) for i in range(5)]
    ids = await asyncio.gather(*(committer.commit_writer(w) for w in writers))
    counts = committer.batch_sync.syncfs_batches, committer.batch_sync.fsync_batches
    await committer.close()

    assert counts == (1, 0)
    assert [what for what, _ in events] == ["syncfs"] + ["link"] * 5 + ["dir fsync"]
    assert not any(on_loop for _, on_loop in events)  # all of it in the commit thread
    assert set(ids) == set(spool.list_ids("incoming"))
    for qid in ids:
        assert QueueFile.open(spool.path("incoming", qid)).content_size == len(b"body 0\n")


async def test_with_the_limit_zero_every_file_is_fsynced(
    spool: Spool, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[str] = []
    real_sync = BatchSync.sync

    def syncfs(self: BatchSync) -> bool:
        calls.append("syncfs")
        return real_sync(self)

    monkeypatch.setattr(BatchSync, "sync", syncfs)
    committer = GroupCommitter(spool, syncfs_dirty_limit=0)
    ids = await asyncio.gather(*(committer.commit_writer(_writer(spool, b"x\n")) for _ in range(3)))
    counts = committer.batch_sync.syncfs_batches, committer.batch_sync.fsync_batches
    await committer.close()
    assert calls == [] and counts[0] == 0 and counts[1] >= 1
    assert set(ids) == set(spool.list_ids("incoming"))


def _eio(fd: int) -> int:
    """The C library's syncfs after a failed write-back: -1 with errno EIO."""
    ctypes.set_errno(errno.EIO)
    return -1


def test_a_failed_syncfs_fails_its_batch_and_every_later_batch_fsyncs_its_files(
    spool: Spool, tmp_path: Path
) -> None:
    """The batch of the failed syncfs: every file refused and removed. After it the committer
    no longer trusts syncfs: no whole-fs batch is chosen, and a batch already handed one
    fsyncs its files (which reports their own errors) and lands."""
    meminfo = _meminfo(tmp_path / "meminfo", 10)
    batch_sync = BatchSync(str(spool.root), EVERYTHING, meminfo=meminfo, uname=NEW_KERNEL)
    writers = [_writer(spool, b"body %d\n" % i) for i in range(3)]
    later = [_writer(spool, b"later %d\n" % i) for i in range(2)]
    try:
        assert batch_sync.whole_fs()
        real = batch_sync._syncfs
        batch_sync._syncfs = _eio
        for writer in writers + later:
            writer.finish()
        results = commit_writers(spool, writers, keep_open=True, batch_sync=batch_sync)
        batch_sync._syncfs = real
        assert batch_sync.failed and not batch_sync.whole_fs()
        landed = commit_writers(spool, later, keep_open=True, batch_sync=batch_sync)
    finally:
        batch_sync.close()
        for writer in writers + later:
            writer.release()
    assert all(isinstance(r, SpoolError) for r in results) and len(results) == 3
    assert "Input/output error" in str(results[0])
    assert all(isinstance(r, str) for r in landed)
    assert sorted(os.listdir(spool.root / "incoming")) == sorted(str(r) for r in landed)
    leftovers = [p for p in spool.root.rglob("*") if p.is_file() and p.stat().st_size > 0]
    assert sorted(p.name for p in leftovers) == sorted(str(r) for r in landed)


def test_the_root_is_opened_before_any_write_or_never(tmp_path: Path) -> None:
    """syncfs reports errors since its descriptor was opened: a root that is not there when
    the committer starts is not opened later (every batch fsyncs its files)."""
    meminfo = _meminfo(tmp_path / "meminfo", 10)
    root = tmp_path / "later"
    sync = BatchSync(str(root), EVERYTHING, meminfo=meminfo, uname=NEW_KERNEL)
    try:
        root.mkdir()
        assert not sync.whole_fs() and not sync.whole_fs()
        assert (sync.syncfs_batches, sync.fsync_batches) == (0, 2)
    finally:
        sync.close()
