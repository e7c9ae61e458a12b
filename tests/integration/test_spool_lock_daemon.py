"""A second ``qmgrd run`` on a live spool, or one on an unsafe spool: refused, untouched."""

from __future__ import annotations

import os
import smtplib
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.config import free_port as _free_port
from tests.support.config import write_config
from tests.support.process import TIMEOUT, DaemonProcess

REPO = Path(__file__).resolve().parents[2]


def _config(tmp_path: Path, port: int, extra: str = "") -> Path:
    return write_config(tmp_path, extra, listen=f"127.0.0.1:{port}")


def _qmgrd(cfg: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "qmgrd", "-c", str(cfg), *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
    )


@pytest.fixture
def silent_mx() -> Iterator[int]:
    """A TCP port that completes handshakes (kernel backlog) but never sends a greeting."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    try:
        yield int(sock.getsockname()[1])
    finally:
        sock.close()


def test_second_daemon_is_refused_and_moves_nothing(tmp_path: Path, silent_mx: int) -> None:
    """While a daemon delivers a message from active/, a second ``qmgrd run`` exits 1 with one
    line naming the first daemon's pid; the active file stays and the first daemon logs no error."""
    port = _free_port()
    cfg = _config(tmp_path, port, f"relayhost = [127.0.0.1]:{silent_mx}\nshutdown_timeout = 1s\n")
    spool = tmp_path / "spool"
    first = DaemonProcess(cfg).start()
    try:
        out = first
        out.wait_for("daemon started")
        with smtplib.SMTP("127.0.0.1", port, timeout=TIMEOUT) as client:
            client.sendmail("s@example.com", ["r@example.com"], b"Subject: 1\r\n\r\nhi\r\n")
        lines = out.wait_for("(queue active)")
        active = sorted(os.listdir(spool / "active"))
        assert len(active) == 1
        modes = {p: os.stat(p).st_mode for p in [spool, *spool.iterdir()]}

        second = _qmgrd(cfg, "run")

        assert second.returncode == 1
        assert second.stderr.splitlines() == [
            f"qmgrd: fatal: the queue directory {spool} is in use by another qmgrd daemon "
            f"(pid {first.proc.pid}, lock file {spool / 'pid' / 'master.pid'})"
        ], second.stderr
        assert sorted(os.listdir(spool / "active")) == active
        assert os.listdir(spool / "incoming") == []
        assert {p: os.stat(p).st_mode for p in [spool, *spool.iterdir()]} == modes
        # The first daemon goes on: a second message is accepted and scheduled, with no
        # error or warning line in between (the old failure: "cannot open" every 5 s).
        with smtplib.SMTP("127.0.0.1", port, timeout=TIMEOUT) as client:
            client.sendmail("s@example.com", ["r@example.com"], b"Subject: 2\r\n\r\nhi\r\n")
        lines += out.wait_for("(queue active)")
        assert [line for line in lines if "error" in line or "warning" in line] == []
        assert first.stop() == 0
    finally:
        first.close()


def test_daemon_starts_after_the_previous_one_was_killed(tmp_path: Path) -> None:
    """kill -9 leaves a pid file behind, but its lock died with the process: a restart works."""
    port = _free_port()
    cfg = _config(tmp_path, port)
    for _ in range(2):
        daemon = DaemonProcess(cfg).start()
        try:
            daemon.wait_for("daemon started")
            assert (tmp_path / "spool" / "pid" / "master.pid").read_text().strip() == str(
                daemon.proc.pid
            )
            daemon.kill()
        finally:
            daemon.close()


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to chown to nobody")
def test_daemon_refuses_a_spool_owned_by_another_user(tmp_path: Path) -> None:
    """``qmgrd run`` on a spool owned by nobody exits 1 with one line and changes nothing."""
    cfg = _config(tmp_path, _free_port())
    spool = tmp_path / "spool"
    (spool / "incoming").mkdir(parents=True)
    for path in (spool, spool / "incoming"):
        os.chmod(path, 0o755)
        os.chown(path, 65534, 65534)
    result = _qmgrd(cfg, "run")
    assert result.returncode == 1
    assert result.stderr.splitlines() == [
        f"qmgrd: fatal: unsafe spool directory {spool}: owned by uid 65534 (nobody), "
        f"not by the daemon's user uid 0 (root); refusing to use it (chown -R root {spool}, "
        "or run the daemon as its owner)"
    ]
    assert os.listdir(spool) == ["incoming"]
    assert os.stat(spool).st_mode & 0o777 == 0o755


def test_daemon_refuses_a_symlinked_queue_subdirectory(tmp_path: Path) -> None:
    """``qmgrd run`` with spool/deferred a symlink exits 1 and never writes through the link."""
    cfg = _config(tmp_path, _free_port())
    spool = tmp_path / "spool"
    spool.mkdir(mode=0o700)
    target = tmp_path / "elsewhere"
    target.mkdir()
    (spool / "deferred").symlink_to(target)
    result = _qmgrd(cfg, "run")
    assert result.returncode == 1
    assert result.stderr.splitlines() == [
        f"qmgrd: fatal: unsafe spool directory {spool / 'deferred'}: it is a symbolic link; "
        "refusing to use it (make it a directory)"
    ]
    assert os.listdir(target) == []
    assert sorted(os.listdir(spool)) == ["deferred", "pid"]
