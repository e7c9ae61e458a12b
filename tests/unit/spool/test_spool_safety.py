"""Spool trust checks: foreign owners, symlinked and writable directories, foreign queue files."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from qmgrd.errors import SpoolError
from qmgrd.spool import DIRECTORIES, Envelope, RecipientSpec, Spool

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to chown to nobody")
NOBODY = 65534
ENV = Envelope("s@example.com", (RecipientSpec("r@example.com"),), 1_700_000_000.0)


def _mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def _made(tmp_path: Path) -> Spool:
    spool = Spool(tmp_path / "spool", fsync=False)
    spool.ensure_dirs()
    return spool


@needs_root
def test_spool_owned_by_another_user_is_refused_and_left_alone(tmp_path: Path) -> None:
    """A queue_directory owned by nobody is refused; its mode is not "fixed" and nothing is made."""
    root = tmp_path / "spool"
    root.mkdir(mode=0o755)
    os.chmod(root, 0o755)
    os.chown(root, NOBODY, NOBODY)
    with pytest.raises(SpoolError, match=r"owned by uid 65534 \(nobody\), not by the daemon's"):
        Spool(root).ensure_dirs()
    assert _mode(root) == 0o755
    assert os.listdir(root) == []


@needs_root
@pytest.mark.parametrize("name", DIRECTORIES)
def test_subdirectory_owned_by_another_user_is_refused(tmp_path: Path, name: str) -> None:
    """Each queue and log subdirectory must belong to the daemon's user."""
    spool = _made(tmp_path)
    os.chown(spool.root / name, NOBODY, NOBODY)
    with pytest.raises(SpoolError, match=f"{name}: owned by uid 65534"):
        spool.ensure_dirs()


def test_symlinked_subdirectory_is_refused_and_not_followed(tmp_path: Path) -> None:
    """incoming/ as a symlink to another directory is refused; the target is not touched."""
    spool = _made(tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o777)
    os.chmod(elsewhere, 0o777)
    (spool.root / "incoming").rmdir()
    (spool.root / "incoming").symlink_to(elsewhere)
    with pytest.raises(SpoolError, match="incoming: it is a symbolic link"):
        spool.ensure_dirs()
    assert _mode(elsewhere) == 0o777


@pytest.mark.parametrize(("where", "mode"), [("incoming", 0o770), ("", 0o707), ("defer", 0o722)])
def test_group_or_world_writable_directory_is_refused(
    tmp_path: Path, where: str, mode: int
) -> None:
    """A directory others could already have written to is refused, not silently tightened."""
    spool = _made(tmp_path)
    path = spool.root / where if where else spool.root
    os.chmod(path, mode)
    with pytest.raises(SpoolError, match=r"-writable \(mode 0"):
        spool.ensure_dirs()
    assert _mode(path) == mode


def test_readable_directory_is_tightened_with_a_warning(tmp_path: Path) -> None:
    """0755 (a loose umask) is only a privacy problem: set to 0700, with a warning naming it."""
    spool = _made(tmp_path)
    os.chmod(spool.root / "hold", 0o755)
    with capture_logs() as logs:
        spool.ensure_dirs()
    assert _mode(spool.root / "hold") == 0o700
    assert [e["directory"] for e in logs] == [str(spool.root / "hold")]


def test_symlinked_queue_directory_owned_by_the_daemon_user_is_accepted(tmp_path: Path) -> None:
    """queue_directory may be a symlink to the real spool (another disk); the target is checked."""
    real = _made(tmp_path)
    link = tmp_path / "link"
    link.symlink_to(real.root)
    Spool(link).ensure_dirs()
    os.chmod(real.root, 0o777)
    with pytest.raises(SpoolError, match="world-writable"):
        Spool(link).ensure_dirs()


@needs_root
def test_symlinked_queue_directory_owned_by_another_user_is_refused(tmp_path: Path) -> None:
    """A queue_directory symlink that another user could re-point is refused."""
    real = _made(tmp_path)
    link = tmp_path / "link"
    link.symlink_to(real.root)
    os.chown(link, NOBODY, NOBODY, follow_symlinks=False)
    with pytest.raises(SpoolError, match="symbolic link owned by uid 65534"):
        Spool(link).ensure_dirs()


def test_queue_directory_that_is_a_file_is_refused(tmp_path: Path) -> None:
    """A plain file where a queue directory should be is refused with its name."""
    spool = _made(tmp_path)
    (spool.root / "corrupt").rmdir()
    (spool.root / "corrupt").write_text("x")
    with pytest.raises(SpoolError, match="corrupt: not a directory"):
        spool.ensure_dirs()


@needs_root
def test_queue_file_owned_by_another_user_is_quarantined(tmp_path: Path) -> None:
    """A queue file the daemon's user did not write (possibly forged) goes to corrupt/."""
    spool = _made(tmp_path)
    forged = spool.commit(ENV, b"Subject: forged\r\n\r\nx\r\n")
    mine = spool.commit(ENV, b"Subject: mine\r\n\r\nx\r\n")
    os.chown(spool.path("incoming", forged), NOBODY, NOBODY)
    with capture_logs() as logs:
        assert spool.sweep_foreign() == 1
    assert spool.list_ids("incoming") == [mine]
    assert (spool.root / "corrupt" / forged).exists()
    assert "owned by uid 65534" in logs[0]["reason"]
