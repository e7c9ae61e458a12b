"""The load's one read of a queue file gives what QueueFile.open, a recipient read, the
file's mode and a content read give, from one open."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from qmgrd.errors import SpoolError
from qmgrd.spool import (
    Envelope,
    QueueFile,
    QueueFileContent,
    QueueFileIOError,
    RecipientSpec,
    Spool,
    loadread,
    mark_done,
    mark_forced_expire,
)
from qmgrd.spool.loadread import load_queue_file
from qmgrd.spool.records import open_regular_stat


@pytest.fixture
def spool(tmp_path: Path) -> Spool:
    s = Spool(tmp_path / "spool", fsync=False)
    s.ensure_dirs()
    return s


def _commit(spool: Spool, rcpts: int, content: bytes) -> Path:
    env = Envelope(
        sender="s@x.test",
        recipients=tuple(RecipientSpec(f"r{i}@y.test", notify=frozenset({"NEVER"}) if i % 2
                                       else frozenset()) for i in range(rcpts)),
        arrival_time=1_000_000_000.5,
        envid="ENV1",
    )
    return spool.path("incoming", spool.commit(env, content))


@pytest.mark.parametrize("size", [10, 40_000, 70_000, 200_000, 300_000])
@pytest.mark.parametrize("limit", [1, 3, 50])
def test_one_read_equals_the_separate_reads(spool: Spool, size: int, limit: int) -> None:
    """Envelope, first recipients (done ones skipped), resume offset and content are what
    the separate reads give, small file or big, content kept only up to ``keep``."""
    content = bytes(range(256)) * (size // 256) + b"end\r\n"
    path = _commit(spool, 7, content)
    every = QueueFile.open(path).read_all_recipients()
    mark_done(path, [every[0].offset, every[3].offset], fsync=False)
    qf = QueueFile.open(path)
    keep = 100_000
    got = load_queue_file(path, limit, keep)
    assert got.qf == qf
    assert (got.recipients, got.next_offset) == qf.read_recipients(
        qf.first_recipient_offset, limit
    )
    assert got.mode == os.stat(path).st_mode
    assert got.content == (content if len(content) <= keep else None)
    assert load_queue_file(path, limit).content is None  # keep 0: nothing held


def test_the_mode_carries_the_forced_expire_mark(spool: Spool) -> None:
    path = _commit(spool, 1, b"x\r\n")
    mark_forced_expire(path)
    assert load_queue_file(path, 10).mode == os.stat(path).st_mode


def test_a_bad_recipient_record_is_kept_as_the_read_would_raise_it(spool: Spool) -> None:
    """A damaged recipient record: the envelope loads, the recipients are the error."""
    path = _commit(spool, 2, b"x\r\n")
    qf = QueueFile.open(path)
    second = qf.read_all_recipients()[1].offset
    data = bytearray(path.read_bytes())
    data[second] = ord("Z")  # not an R or D record
    path.write_bytes(bytes(data))
    got = load_queue_file(path, 10, 1000)
    assert isinstance(got.recipients, SpoolError) and got.next_offset == 0
    with pytest.raises(SpoolError, match="unexpected record type"):
        qf.read_recipients(qf.first_recipient_offset, 10)


def test_system_errors_are_io_errors_and_damage_is_corruption(
    spool: Spool, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = _commit(spool, 1, b"x\r\n")
    link = path.with_name("link")
    link.symlink_to(path)
    with pytest.raises(SpoolError, match="symbolic link") as info:
        load_queue_file(link, 10)
    assert not isinstance(info.value, QueueFileIOError)
    path.write_bytes(path.read_bytes()[:-3])  # truncated
    with pytest.raises(SpoolError) as info:
        load_queue_file(path, 10)
    assert not isinstance(info.value, QueueFileIOError)

    def emfile(path: Path, flags: int, mode: int = 0o600) -> tuple[int, os.stat_result]:
        raise OSError(errno.EMFILE, os.strerror(errno.EMFILE))

    monkeypatch.setattr(loadread, "open_regular_stat", emfile)
    with pytest.raises(QueueFileIOError, match=os.strerror(errno.EMFILE)):
        load_queue_file(path, 10)


async def test_held_content_is_sent_without_reading_the_file(spool: Spool) -> None:
    """QueueFileContent with ``data``: the chunks and read() are the data, file or no file."""
    path = _commit(spool, 1, b"0123456789")
    qf = QueueFile.open(path)
    content = QueueFileContent(path, qf.content_offset, qf.content_size, data=b"0123456789")
    path.unlink()
    assert [c async for c in content.chunks(4)] == [b"0123", b"4567", b"89"]
    assert content.read() == b"0123456789"


def test_a_file_that_grew_since_the_fstat_is_read_as_a_big_one(
    spool: Spool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The one pread asks for the stat size + 1: more bytes than the stat said are not
    parsed as the whole file; the buffered path reads it by its stat size."""
    path = _commit(spool, 2, b"x\r\n" * 100)
    want = load_queue_file(path, 10, 100_000)

    def grows(path: Path, flags: int, mode: int = 0o600) -> tuple[int, os.stat_result]:
        fd, st = open_regular_stat(path, flags, mode)
        with open(path, "ab") as f:
            f.write(b"junk")
        return fd, st

    monkeypatch.setattr(loadread, "open_regular_stat", grows)
    got = load_queue_file(path, 10, 100_000)
    assert (got.qf, got.recipients, got.next_offset) == (want.qf, want.recipients, 0)
    assert got.content is None and want.content == b"x\r\n" * 100
