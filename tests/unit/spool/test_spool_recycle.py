"""Recycled queue files: a done message's inode becomes a new temporary file, never mail twice."""

from __future__ import annotations

import os

import pytest

from qmgrd.errors import InvariantError, SpoolError
from qmgrd.spool import QueueFile, RecipientSpec, Spool, read_content
from qmgrd.spool.marks import FORCED_EXPIRE_MODE
from qmgrd.spool.records import encode_queue_file
from qmgrd.spool.recycle import MAX_SIZE, RECYCLE_DIR, SLOTS, Recycler, retire
from qmgrd.spool.writer import QueueFileWriter
from tests.unit.spool.test_spool_writer import HEAD, RCPTS, _envelope, _write


def _commit(
    spool: Spool, content: bytes, recycler: Recycler | None, *, flush: int = 1 << 20
) -> str:
    return _write(spool, content, flush_size=flush, piece=65536, recycler=recycler)


def _retire_active(spool: Spool, qid: str, size: int) -> bool:
    """What the queue manager does with a finished message: active/ then retire."""
    spool.move(qid, "incoming", "active")
    return retire(str(spool.root), "active", qid, size)


def _pooled(spool: Spool) -> list[str]:
    return sorted(os.listdir(spool.root / RECYCLE_DIR))


def test_a_retired_file_is_reused_and_cut_to_the_new_length(spool: Spool) -> None:
    """The new message's file is the old inode, byte for byte a fresh write, nothing old left."""
    recycler = Recycler(str(spool.root))
    old = _commit(spool, b"x" * 20_000, None)
    inode = os.stat(spool.path("incoming", old)).st_ino
    assert _retire_active(spool, old, 20_000)
    assert len(_pooled(spool)) == 1 and os.listdir(spool.root / "active") == []
    content = b"Subject: new\r\n\r\nshort\r\n"
    qid = _commit(spool, content, recycler)
    path = spool.path("incoming", qid)
    assert os.stat(path).st_ino == inode  # the same inode: no allocation
    head, tail = encode_queue_file(_envelope(), len(content))
    assert path.read_bytes() == head + content + tail  # no byte of the old message
    assert _pooled(spool) == []
    assert sorted(os.listdir(spool.root / "incoming")) == [qid]  # no temporary left


def test_a_reused_file_longer_than_the_old_one_reads_back(spool: Spool) -> None:
    """Flushed while written into a pooled file (padding path): same envelope and content."""
    recycler = Recycler(str(spool.root))
    old = _commit(spool, b"old", None)
    assert _retire_active(spool, old, 3)
    content = bytes(range(256)) * 1200  # 300 KiB, flushed every 4 KiB
    qid = _commit(spool, content, recycler, flush=4096)
    qf = QueueFile.open(spool.path("incoming", qid))
    assert [RecipientSpec(r.address, r.orcpt, r.notify) for r in qf.read_all_recipients()] == list(
        RCPTS
    )
    assert read_content(qf.path) == content
    assert _pooled(spool) == []


def test_an_empty_pool_creates_a_file_and_a_file_is_claimed_once(spool: Spool) -> None:
    """No pooled file: a new one, as before. One pooled file serves one writer only."""
    assert Recycler(str(spool.root)).claim(str(spool.root / "incoming" / ".A")) is None
    first, second = Recycler(str(spool.root)), Recycler(str(spool.root))
    qid = _commit(spool, b"a", None)
    assert _retire_active(spool, qid, 1)
    second._scan()  # both processes saw the name
    claimed = first.claim(str(spool.root / "incoming" / ".B"))
    assert claimed is not None
    os.close(claimed[0])
    assert second.claim(str(spool.root / "incoming" / ".C")) is None
    assert sorted(os.listdir(spool.root / "incoming")) == [".B"]


def test_a_file_with_another_name_is_never_reused(spool: Spool) -> None:
    """A hold made during the delivery (hold/ links the same inode) keeps the file as mail."""
    recycler = Recycler(str(spool.root))
    qid = _commit(spool, b"held mail", None)
    spool.move(qid, "incoming", "active")
    os.link(spool.path("active", qid), spool.path("hold", qid))
    assert retire(str(spool.root), "active", qid, 9)
    new = _commit(spool, b"other", recycler)
    assert os.stat(spool.path("incoming", new)).st_ino != os.stat(spool.path("hold", qid)).st_ino
    assert read_content(spool.path("hold", qid)) == b"held mail"
    assert os.stat(spool.path("hold", qid)).st_nlink == 1  # the pool's name went
    assert sorted(os.listdir(spool.root / "incoming")) == [new]


def test_mode_marks_do_not_survive_reuse(spool: Spool) -> None:
    """A forced-expire mark (a mode bit) on the old file is not carried to the new message."""
    recycler = Recycler(str(spool.root))
    qid = _commit(spool, b"a", None)
    os.chmod(spool.path("incoming", qid), 0o600 | FORCED_EXPIRE_MODE)
    assert _retire_active(spool, qid, 1)
    new = _commit(spool, b"b", recycler)
    assert os.stat(spool.path("incoming", new)).st_mode & 0o7777 == 0o600


def test_retire_bounds_the_pool(spool: Spool) -> None:
    """Large files are unlinked, names are at most SLOTS, a missing file is False."""
    big = _commit(spool, b"x", None)
    assert _retire_active(spool, big, MAX_SIZE + 1)
    assert not (spool.root / RECYCLE_DIR).exists()  # unlinked, not pooled
    assert not retire(str(spool.root), "active", big, 1)  # already gone
    for _ in range(SLOTS + 50):
        assert _retire_active(spool, _commit(spool, b"x", None), 1)
    assert 0 < len(_pooled(spool)) <= SLOTS
    assert os.listdir(spool.root / "active") == []


def test_a_discarded_reused_file_leaves_nothing(spool: Spool) -> None:
    """A transaction aborted after claiming a pooled file removes it like a new one."""
    recycler = Recycler(str(spool.root))
    assert _retire_active(spool, _commit(spool, b"a", None), 1)
    writer = QueueFileWriter(spool, HEAD, flush_size=16, recycler=recycler)
    writer.add_recipient(RCPTS[0])
    writer.flush()
    assert os.listdir(spool.root / "incoming") == ["." + writer.queue_id]
    writer.discard()
    assert os.listdir(spool.root / "incoming") == [] and _pooled(spool) == []


def test_retire_reports_a_disk_refusal_as_a_spool_error(spool: Spool) -> None:
    """recycle/ that cannot take the file (here: not a directory): SpoolError, file kept."""
    (spool.root / RECYCLE_DIR).write_bytes(b"")
    qid = _commit(spool, b"a", None)
    spool.move(qid, "incoming", "active")
    with pytest.raises(SpoolError, match="cannot remove active/"):
        retire(str(spool.root), "active", qid, 1)
    assert spool.path("active", qid).exists()


def test_parts_of_the_pool_are_claimed_by_their_own_process_only(spool: Spool) -> None:
    """Two workers' recyclers (parts 0 and 1 of 2) each claim only the names of their part."""
    for _ in range(40):
        assert _retire_active(spool, _commit(spool, b"x", None), 1)
    pooled = _pooled(spool)
    even = sorted(n for n in pooled if int(n, 16) % 2 == 0)
    odd = sorted(n for n in pooled if int(n, 16) % 2 == 1)
    assert even and odd  # 40 hashes over 256 names: both parts have files
    first, second = Recycler(str(spool.root), part=0, parts=2), Recycler(
        str(spool.root), part=1, parts=2
    )
    for i in range(len(even)):
        claimed = first.claim(str(spool.root / "incoming" / f".E{i}"))
        assert claimed is not None
        os.close(claimed[0])
    assert first.claim(str(spool.root / "incoming" / ".E-last")) is None  # the odd ones stay
    assert _pooled(spool) == odd
    for i in range(len(odd)):
        claimed = second.claim(str(spool.root / "incoming" / f".O{i}"))
        assert claimed is not None
        os.close(claimed[0])
    assert _pooled(spool) == []


def test_a_part_outside_the_parts_is_a_bug() -> None:
    with pytest.raises(InvariantError):
        Recycler("/nonexistent", part=2, parts=2)
