"""File modes: the spool and the control socket are closed to other users, whatever the umask."""

from __future__ import annotations

import os
import smtplib
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from qmgrd.spool import DIRECTORIES, Envelope, ReasonRecord, RecipientSpec, Spool
from tests.support.config import free_port, write_config
from tests.support.process import TIMEOUT, DaemonProcess, running_daemon_process


def _mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def _loose(path: Path) -> bool:
    """Whether anyone but the owner (or, for the socket, its group) can get at ``path``."""
    mode = _mode(path)
    if stat.S_ISSOCK(os.lstat(path).st_mode):
        return bool(mode & 0o007)
    return bool(mode & 0o077)


@pytest.fixture
def daemon_umask0(tmp_path: Path) -> Iterator[tuple[DaemonProcess, int, Path]]:
    """``qmgrd run`` started with umask 000, the most permissive an operator could leave."""
    port = free_port()
    # No reachable relay: a message stays queued so its files can be inspected.
    conf = write_config(
        tmp_path,
        "relayhost = [127.0.0.1]:9\nsmtp_connect_timeout = 1s\n",
        listen=f"127.0.0.1:{port}",
    )
    with running_daemon_process(conf, umask=0) as proc:
        yield proc, port, tmp_path / "spool"


def test_daemon_spool_files_and_control_socket_are_private(
    daemon_umask0: tuple[DaemonProcess, int, Path],
) -> None:
    """Under umask 000 the spool, each queue directory, queue files and defer logs are 0700/0600
    and the control socket grants nothing to other users."""
    out, port, spool = daemon_umask0
    with smtplib.SMTP("127.0.0.1", port, timeout=TIMEOUT) as client:
        client.sendmail("s@example.com", ["r@example.com"], b"Subject: x\r\n\r\nhi\r\n")
    out.wait_for("status=deferred")
    out.wait_for("next_attempt=")
    assert _mode(spool) == 0o700
    for name in DIRECTORIES:
        assert _mode(spool / name) == 0o700, name
    files = [p for name in ("deferred", "defer") for p in (spool / name).iterdir()]
    assert len(files) == 2, files
    for path in files:
        assert _mode(path) == 0o600, path
    sockets = [p for p in (spool / "public").iterdir() if stat.S_ISSOCK(os.lstat(p).st_mode)]
    assert [p.name for p in sockets] == ["qmgrd.sock"]
    assert not _loose(sockets[0]), oct(_mode(sockets[0]))
    # maildrop/ (1730) and its .wakeup FIFO (0620) are group-writable by design (sendmail's
    # submit group, as Postfix's postdrop); inside the 0700 spool they grant nothing
    maildrop = spool / "maildrop"
    assert _mode(maildrop) == 0o1730 and _mode(maildrop / ".wakeup") == 0o620
    leaks = [p for p in spool.rglob("*") if _loose(p) and p not in (maildrop, maildrop / ".wakeup")]
    assert leaks + ([spool] if _loose(spool) else []) == []
    assert out.stop() == 0


def test_existing_loose_spool_directories_are_tightened(tmp_path: Path) -> None:
    """Spool directories made beforehand with 0755/0751 are set to 0700 at start, with a warning.

    (Group- or world-writable ones are refused instead: tests/unit/spool/test_spool_safety.py.)
    """
    root = tmp_path / "spool"
    root.mkdir(mode=0o755)
    os.chmod(root, 0o755)
    (root / "incoming").mkdir()
    os.chmod(root / "incoming", 0o751)
    with capture_logs() as logs:
        Spool(root).ensure_dirs()
    assert _mode(root) == 0o700 and _mode(root / "incoming") == 0o700
    warned = sorted(e["directory"] for e in logs if e["log_level"] == "warning")
    assert warned == [str(root), str(root / "incoming")]


def test_queue_files_and_reason_logs_are_0600_under_umask_0(tmp_path: Path) -> None:
    """Commit and reason-log writes create owner-only files even with umask 000."""
    old = os.umask(0)
    try:
        spool = Spool(tmp_path / "spool", fsync=False)
        spool.ensure_dirs()
        qid = spool.commit(
            Envelope("s@x.test", (RecipientSpec("r@y.test"),), arrival_time=1e9), b"hi\r\n"
        )
        spool.append_reasons(
            "bounce", qid, [ReasonRecord("r@y.test", "5.0.0", "failed", "no", 1e9, "none", None)]
        )
    finally:
        os.umask(old)
    assert _mode(spool.path("incoming", qid)) == 0o600
    assert _mode(spool.root / "bounce" / qid) == 0o600
