"""Spool directories, ids, moves, scans, quarantine, commit failures and reason logs."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from qmgrd.errors import SpoolError
from qmgrd.spool import (
    DIRECTORIES,
    Envelope,
    GroupCommitter,
    QueueIdGenerator,
    ReasonRecord,
    RecipientSpec,
    Spool,
    is_queue_id,
    sort_queue_ids,
)

ENV = Envelope("s@example.com", (RecipientSpec("r@example.com"),), 1_700_000_000.0)


@pytest.fixture
def spool(tmp_path: Path) -> Spool:
    """Unlike the shared fixture, with fsync: the store's durable path is under test here."""
    s = Spool(tmp_path / "spool")
    s.ensure_dirs()
    return s


def test_ensure_dirs_creates_every_directory_mode_0700(tmp_path: Path) -> None:
    """All queue and log directories exist afterwards with owner-only access."""
    s = Spool(tmp_path / "a" / "spool")
    s.ensure_dirs()
    s.ensure_dirs()  # idempotent
    for name in DIRECTORIES:
        assert (s.root / name).stat().st_mode & 0o777 == 0o700


def test_ensure_dirs_error_is_a_spool_error(tmp_path: Path) -> None:
    """A spool root that cannot be created is reported as a SpoolError naming it."""
    (tmp_path / "file").write_text("x")
    with pytest.raises(SpoolError, match="file"):
        Spool(tmp_path / "file" / "spool").ensure_dirs()


@pytest.mark.parametrize("long_ids", [False, True])
def test_queue_ids_strictly_increase_even_when_the_clock_stands_still(long_ids: bool) -> None:
    """A frozen or backwards clock still yields unique, creation-ordered, well-formed ids."""
    times = iter([5_000_000, 5_000_000, 4_000_000, 5_000_000] + [9_000_000] * 100)
    gen = QueueIdGenerator(lambda: next(times), salt=7, long_ids=long_ids)
    ids = [gen.next() for _ in range(50)]
    assert ids == sort_queue_ids(reversed(ids), now=0.0)
    assert len(set(ids)) == 50
    assert all(is_queue_id(i) for i in ids)


def test_long_queue_ids_differ_across_generators_in_the_same_microsecond() -> None:
    """Two processes (different salts) never produce the same long id for the same instant."""
    a = QueueIdGenerator(lambda: 1_000, salt=1, long_ids=True).next()
    b = QueueIdGenerator(lambda: 1_000, salt=2, long_ids=True).next()
    assert a != b
    assert a[:11] == b[:11]


def test_list_ignores_temporary_and_stray_names(spool: Spool) -> None:
    """Scans return committed ids only, sorted by arrival."""
    ids = [spool.commit(ENV, b"x") for _ in range(3)]
    (spool.root / "incoming" / ".ABCDEFGHJKMNPQR").write_bytes(b"partial")
    (spool.root / "incoming" / "README").write_bytes(b"stray")
    assert spool.list_ids("incoming") == ids


def test_move_sets_mtime_and_due_ids_select_by_it(spool: Spool) -> None:
    """Deferred files carry their next-attempt time as mtime; due_ids picks those <= now+1."""
    early, late = spool.commit(ENV, b"1"), spool.commit(ENV, b"2")
    spool.move(early, "incoming", "deferred", mtime=1000.0)
    spool.move(late, "incoming", "deferred", mtime=2000.0)
    assert spool.path("deferred", early).stat().st_mtime == 1000.0
    assert spool.due_ids("deferred", 998.0) == []
    assert spool.due_ids("deferred", 999.0) == [early]
    assert spool.due_ids("deferred", 5000.0) == [early, late]
    assert spool.list_ids("incoming") == []


def test_move_of_missing_file_is_a_spool_error(spool: Spool) -> None:
    """Moving a message that is not there names the message and both queues."""
    with pytest.raises(SpoolError, match="incoming to active"):
        spool.move("0000000000000AB", "incoming", "active")


def test_remove_reports_whether_a_file_was_there(spool: Spool) -> None:
    """remove() deletes a queue file and tolerates one that is already gone."""
    qid = spool.commit(ENV, b"x")
    assert spool.remove("incoming", qid) is True
    assert spool.remove("incoming", qid) is False


def test_quarantine_moves_to_corrupt_and_logs(spool: Spool) -> None:
    """An unreadable file goes to corrupt/ with a warning naming the file and the reason."""
    qid = spool.commit(ENV, b"x")
    with capture_logs() as logs:
        spool.quarantine("incoming", qid, "no end record")
    assert spool.list_ids("corrupt") == [qid]
    assert logs[0]["log_level"] == "warning"
    assert logs[0]["file"] == f"incoming/{qid}"
    assert logs[0]["reason"] == "no end record"


def test_writer_killed_before_commit_leaves_nothing_to_read(tmp_path: Path) -> None:
    """A process killed between writing and publishing leaves only a dot-file, swept at start."""
    root = tmp_path / "spool"
    script = textwrap.dedent(
        f"""
        import os
        from pathlib import Path
        from qmgrd.spool import Envelope, RecipientSpec, Spool
        os.link = lambda *a, **k: os._exit(9)   # die at the publishing step
        s = Spool(Path({str(root)!r}))
        s.ensure_dirs()
        s.commit(Envelope("s@x", (RecipientSpec("r@x"),), 1.0), b"x" * 100000)
        """
    )
    proc = subprocess.run(
        [sys.executable, "-c", script], cwd=Path(__file__).parents[3], timeout=60, check=False
    )
    assert proc.returncode == 9
    spool = Spool(root)
    leftovers = os.listdir(root / "incoming")
    assert len(leftovers) == 1 and leftovers[0].startswith(".")
    for queue in ("incoming", "active", "deferred", "hold"):
        assert spool.list_ids(queue) == []
        assert spool.due_ids(queue, 1e12) == []
    assert spool.remove_temp_files() == 1
    assert os.listdir(root / "incoming") == []


def test_failed_write_leaves_nothing_and_reports_spool_error(spool: Spool) -> None:
    """When incoming/ is unusable the commit raises SpoolError and no file appears anywhere."""
    (spool.root / "incoming").rmdir()
    with pytest.raises(SpoolError, match="write error"):
        spool.commit(ENV, b"x")
    (spool.root / "incoming").mkdir()
    assert spool.list_ids("incoming") == []


def test_failed_directory_sync_unlinks_the_whole_batch(
    spool: Spool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """If the directory fsync fails, no message of the batch stays in incoming/."""

    def broken(_directory: Path) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(Spool, "_fsync_dir", staticmethod(broken))
    results = spool.commit_batch([(ENV, b"a"), (ENV, b"b")])
    assert all(isinstance(r, SpoolError) for r in results)
    assert os.listdir(spool.root / "incoming") == []


async def test_group_commit_batches_concurrent_sessions(
    spool: Spool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Concurrent commits share directory fsyncs and each gets its own id and file."""
    dir_syncs: list[Path] = []
    real = Spool._fsync_dir

    def counting(directory: Path) -> None:
        dir_syncs.append(directory)
        real(directory)

    monkeypatch.setattr(Spool, "_fsync_dir", staticmethod(counting))
    committer = GroupCommitter(spool, max_batch=8)
    import asyncio

    ids = await asyncio.gather(*(committer.commit(ENV, b"%d" % i) for i in range(20)))
    await committer.close()
    assert len(set(ids)) == 20
    # list_ids orders by the time in the id; short hex ids do not sort by string across a
    # second boundary, so compare as sets.
    assert set(ids) == set(spool.list_ids("incoming"))
    assert 3 <= len(dir_syncs) < 20  # 20 requests, batches of at most 8
    with pytest.raises(SpoolError):
        await committer.commit(ENV, b"late")


def test_reason_logs_round_trip_and_tolerate_a_torn_tail(spool: Spool) -> None:
    """Defer/bounce records append durably, read back in order, and a torn last line is ignored."""
    qid = spool.commit(ENV, b"x")
    a = ReasonRecord("a@x", "4.4.1", "delayed", "connect refused", 10.0, "none", "rfc822;a@x")
    b = ReasonRecord("b\u00e9@x", "5.1.1", "failed", "550 no such user", 11.0, "mx[1.2.3.4]:25")
    spool.append_reasons("defer", qid, [a])
    spool.append_reasons("defer", qid, [b])
    with open(spool.root / "defer" / qid, "ab") as f:
        f.write(b'{"address": "torn')
    assert spool.read_reasons("defer", qid) == [a, b]
    assert spool.read_reasons("bounce", qid) == []
    assert spool.remove_reasons("defer", qid) is True
    assert spool.read_reasons("defer", qid) == []
