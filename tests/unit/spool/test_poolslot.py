"""Pooled queue files go to a free name (never replacing one in use while there is room)."""

from __future__ import annotations

import ctypes
import errno
import os
import zlib
from pathlib import Path

import pytest

from qmgrd.spool import poolslot
from qmgrd.spool.poolslot import PROBES, place, prefill
from qmgrd.spool.recycle import RECYCLE_DIR, SLOTS, retire


def _file(path: Path, text: str) -> int:
    path.write_text(text)
    return os.stat(path).st_ino


def test_a_taken_name_is_kept_and_the_next_free_one_used(tmp_path: Path) -> None:
    """The file under the hashed name keeps its inode; the new one goes to the next name."""
    pool = tmp_path / "pool"
    pool.mkdir()
    kept = _file(pool / "05", "old")
    moved = _file(tmp_path / "done", "new")
    place(str(tmp_path / "done"), str(pool), 5, SLOTS)
    assert os.stat(pool / "05").st_ino == kept and (pool / "05").read_text() == "old"
    assert os.stat(pool / "06").st_ino == moved
    assert not (tmp_path / "done").exists()


def test_probing_wraps_around_the_names(tmp_path: Path) -> None:
    pool = tmp_path / "pool"
    pool.mkdir()
    _file(pool / "03", "old")
    _file(tmp_path / "done", "new")
    place(str(tmp_path / "done"), str(pool), 3, 4)
    assert (pool / "00").read_text() == "new"


def test_a_full_pool_replaces_the_hashed_name(tmp_path: Path) -> None:
    """Every probed name taken: the hashed one is replaced (the pool stays bounded)."""
    pool = tmp_path / "pool"
    pool.mkdir()
    for n in range(PROBES):
        _file(pool / f"{10 + n:02x}", f"old{n}")
    _file(tmp_path / "done", "new")
    place(str(tmp_path / "done"), str(pool), 10, SLOTS)
    assert (pool / "0a").read_text() == "new"
    assert len(os.listdir(pool)) == PROBES


def test_a_missing_file_or_directory_is_file_not_found(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        place(str(tmp_path / "gone"), str(tmp_path), 0, SLOTS)
    _file(tmp_path / "done", "new")
    with pytest.raises(FileNotFoundError):
        place(str(tmp_path / "done"), str(tmp_path / "nodir"), 0, SLOTS)


def test_without_renameat2_it_is_a_plain_rename(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(poolslot._NOREPLACE, "fn", None)
    pool = tmp_path / "pool"
    pool.mkdir()
    _file(pool / "05", "old")
    _file(tmp_path / "done", "new")
    place(str(tmp_path / "done"), str(pool), 5, SLOTS)
    assert (pool / "05").read_text() == "new" and os.listdir(pool) == ["05"]


def _colliding(count: int) -> list[str]:
    """``count`` queue ids whose pool names (the hash's) are the same."""
    by_slot: dict[int, list[str]] = {}
    for n in range(100_000):
        qid = f"Q{n:05d}"
        ids = by_slot.setdefault(zlib.crc32(qid.encode()) % SLOTS, [])
        ids.append(qid)
        if len(ids) == count:
            return ids
    raise AssertionError("no collision found")


def test_retire_keeps_every_file_while_the_pool_has_room(tmp_path: Path) -> None:
    """Queue ids whose hashes collide: each finished file stays pooled (no inode freed)."""
    root = tmp_path / "spool"
    (root / "active").mkdir(parents=True)
    inodes = set()
    for qid in _colliding(3):
        inodes.add(_file(root / "active" / qid, qid))
        assert retire(str(root), "active", qid, 10)
    pooled = {os.stat(p).st_ino for p in (root / RECYCLE_DIR).iterdir()}
    assert pooled == inodes


def test_prefill_makes_the_missing_names_only(tmp_path: Path) -> None:
    pool = tmp_path / "recycle"
    pool.mkdir(mode=0o700)
    kept = _file(pool / "01", "pooled message")
    assert prefill(str(pool), 4) == 3
    assert sorted(os.listdir(pool)) == ["00", "01", "02", "03"]
    assert os.stat(pool / "01").st_ino == kept and (pool / "02").stat().st_size == 0
    assert (pool / "00").stat().st_mode & 0o777 == 0o600
    assert prefill(str(pool), 4) == 0


def test_prefill_makes_the_directory_and_stops_quietly_on_errors(tmp_path: Path) -> None:
    pool = tmp_path / "recycle"
    assert prefill(str(pool), 2) == 2
    assert pool.stat().st_mode & 0o777 == 0o700
    assert prefill(str(tmp_path / "missing" / "recycle"), 2) == 0


def _failing(code: int) -> object:
    def fake(*_args: object) -> int:
        ctypes.set_errno(code)
        return -1

    return fake


def test_a_file_system_without_the_flag_falls_back_to_rename_for_good(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """EINVAL (the flag refused): a plain rename now and from then on."""
    monkeypatch.setattr(poolslot._NOREPLACE, "fn", _failing(errno.EINVAL))
    pool = tmp_path / "pool"
    pool.mkdir()
    _file(tmp_path / "done", "new")
    place(str(tmp_path / "done"), str(pool), 7, SLOTS)
    assert (pool / "07").read_text() == "new"
    assert poolslot._NOREPLACE.fn is None


def test_other_errors_are_raised_as_os_errors(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(poolslot._NOREPLACE, "fn", _failing(errno.EACCES))
    with pytest.raises(PermissionError):
        place(str(tmp_path / "done"), str(tmp_path), 0, SLOTS)
