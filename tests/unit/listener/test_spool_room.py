"""The spool's free space at MAIL: a plentiful answer is reused briefly, a tight one never."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from qmgrd.listener.room import MARGIN, REFRESH, SpoolRoom
from tests.support.clock import FakeClock


class FakeFs:
    """``os.statvfs`` with a settable free space; counts the calls."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, free: int) -> None:
        self.free = free
        self.calls = 0
        self.fail = False
        monkeypatch.setattr(os, "statvfs", self.statvfs)

    def statvfs(self, path: Any) -> os.statvfs_result:
        self.calls += 1
        if self.fail:
            raise OSError(5, "Input/output error")
        # bsize, frsize, blocks, bfree, bavail, files, ffree, favail, flag, namemax
        return os.statvfs_result((4096, 1, 0, 0, self.free, 0, 0, 0, 0, 255))


def test_plenty_of_room_is_asked_once_per_refresh(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    fs = FakeFs(monkeypatch, free=10 * MARGIN)
    clock = FakeClock(100.0)
    room = SpoolRoom(str(tmp_path), clock=clock)
    assert all(room.has_room(65536) for _ in range(50))
    clock.advance(REFRESH * 0.9)
    assert room.has_room(65536)
    assert fs.calls == 1
    clock.advance(REFRESH * 0.2)  # older than REFRESH now
    assert room.has_room(65536)
    assert fs.calls == 2


def test_a_spool_near_its_limit_is_asked_at_every_mail_and_a_fill_is_seen_at_once(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Less than MARGIN above the need: no answer is reused (queue_minfree honoured)."""
    need = 1_000_000
    fs = FakeFs(monkeypatch, free=need + MARGIN - 1)
    room = SpoolRoom(str(tmp_path), clock=FakeClock(100.0))
    assert room.has_room(need) and room.has_room(need)
    assert fs.calls == 2
    fs.free = need - 1  # filled up meanwhile, no time passed
    assert not room.has_room(need)
    fs.free = 10 * MARGIN
    assert room.has_room(need)  # space came back: seen at once too
    assert fs.calls == 4


def test_a_big_size_is_checked_against_the_file_system_not_the_cached_answer(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    fs = FakeFs(monkeypatch, free=2 * MARGIN)
    room = SpoolRoom(str(tmp_path), clock=FakeClock(100.0))
    assert room.has_room(65536)
    assert not room.has_room(3 * MARGIN)  # over what the cache vouches for: asked, refused
    assert fs.calls == 2


def test_an_unanswered_statfs_lets_the_commit_decide(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    fs = FakeFs(monkeypatch, free=10 * MARGIN)
    fs.fail = True
    room = SpoolRoom(str(tmp_path), clock=FakeClock(100.0))
    assert room.has_room(65536) and room.has_room(65536)
    assert fs.calls == 2  # a failure is never cached


def test_the_real_file_system_answers(tmp_path: Path) -> None:
    room = SpoolRoom(str(tmp_path))
    assert room.has_room(1)
    assert not room.has_room(1 << 62)
