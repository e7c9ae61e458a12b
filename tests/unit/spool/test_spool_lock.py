"""The spool lock: one daemon per spool, offline commands shared, nothing changed when refused."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from qmgrd.errors import SpoolError
from qmgrd.spool.lock import (
    LOCK_FILE,
    DaemonHoldsSpool,
    SpoolBusy,
    lock_spool,
    lock_spool_shared,
    read_holder_pid,
)

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to chown to nobody")
NOBODY = 65534


def test_daemon_lock_writes_the_pid_and_refuses_a_second_daemon(tmp_path: Path) -> None:
    """The holder's pid is in pid/master.pid and a second exclusive lock names it."""
    root = tmp_path / "spool"
    with lock_spool(root) as held:
        assert held.held and held.exclusive
        assert (root / LOCK_FILE).read_bytes() == f"{os.getpid():>10}\n".encode()
        with pytest.raises(SpoolBusy, match=f"in use by another qmgrd daemon \\(pid {os.getpid()}"):
            lock_spool(root, wait=5)
    assert not held.held


def test_lock_is_free_again_after_release_even_with_a_stale_pid_file(tmp_path: Path) -> None:
    """A pid file left by a dead daemon does not block the next one (flock died with it)."""
    root = tmp_path / "spool"
    (root / "pid").mkdir(parents=True, mode=0o700)
    (root / LOCK_FILE).write_text("     99999\n")
    with lock_spool(root):
        assert read_holder_pid(root) == os.getpid()
    with lock_spool(root):
        pass


def test_shared_lock_is_refused_while_a_daemon_holds_the_spool(tmp_path: Path) -> None:
    """An offline command learns that a daemon runs (and its pid) instead of racing it."""
    root = tmp_path / "spool"
    with lock_spool(root), pytest.raises(DaemonHoldsSpool) as info:
        lock_spool_shared(root)
    assert info.value.pid == os.getpid()


def test_shared_locks_coexist_and_keep_a_daemon_out(tmp_path: Path) -> None:
    """Two offline commands may hold the lock together; a daemon gives up after its wait."""
    root = tmp_path / "spool"
    with lock_spool(root):
        pass
    with lock_spool_shared(root) as one, lock_spool_shared(root) as two:
        assert one.held and two.held
        with pytest.raises(SpoolBusy, match="locked by offline qmgrd commands"):
            lock_spool(root, wait=0)


def test_daemon_waits_for_offline_commands_to_finish(tmp_path: Path) -> None:
    """A daemon starting while an offline command runs gets the lock once the command ends."""
    root = tmp_path / "spool"
    with lock_spool(root):
        pass
    offline = lock_spool_shared(root)
    waits: list[float] = []

    def fake_sleep(seconds: float) -> None:
        waits.append(seconds)
        offline.release()  # the offline command ends while the daemon waits

    with lock_spool(root, wait=30, sleep=fake_sleep) as held:
        assert held.held
    assert len(waits) == 1


def test_shared_lock_on_a_missing_spool_changes_nothing(tmp_path: Path) -> None:
    """An offline command on a spool that does not exist creates nothing."""
    root = tmp_path / "spool"
    with lock_spool_shared(root) as held:
        assert not held.held
    assert not root.exists()


def test_lock_file_that_is_a_symlink_is_refused(tmp_path: Path) -> None:
    """pid/master.pid is never opened through a symlink (it could point at any file)."""
    root = tmp_path / "spool"
    (root / "pid").mkdir(parents=True, mode=0o700)
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    (root / LOCK_FILE).symlink_to(victim)
    with pytest.raises(SpoolError, match="symbolic link"):
        lock_spool(root)
    assert victim.read_text() == "precious\n"


@needs_root
def test_lock_refuses_a_spool_owned_by_another_user_without_touching_it(tmp_path: Path) -> None:
    """A foreign queue_directory is refused before pid/ is created or any mode changed."""
    root = tmp_path / "spool"
    root.mkdir(mode=0o755)
    os.chmod(root, 0o755)
    os.chown(root, NOBODY, NOBODY)
    with pytest.raises(SpoolError, match="owned by uid 65534"):
        lock_spool(root)
    assert os.listdir(root) == []
    assert os.stat(root).st_mode & 0o777 == 0o755


@needs_root
def test_shared_lock_by_root_leaves_files_the_daemon_user_can_open(tmp_path: Path) -> None:
    """Root's offline command on another user's spool hands pid/ and the lock file to that user."""
    root = tmp_path / "spool"
    root.mkdir(mode=0o700)
    os.chown(root, NOBODY, NOBODY)
    with lock_spool_shared(root) as held:
        assert held.held
    assert os.stat(root / "pid").st_uid == NOBODY
    assert os.stat(root / LOCK_FILE).st_uid == NOBODY
