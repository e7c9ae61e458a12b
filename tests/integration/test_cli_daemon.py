"""The operator CLI as separate processes against ``qmgrd run`` (what an operator types)."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.test_run import REPO, TIMEOUT, Output, _config, _free_port


def _qmgrd(cfg: Path, *args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "qmgrd", "-c", str(cfg), *args],
        cwd=REPO,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
    )


@pytest.fixture
def running(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    """``qmgrd run`` in a subprocess, relaying to a port nobody listens on (mail defers)."""
    cfg = _config(tmp_path, _free_port(), f"relayhost = [127.0.0.1]:{_free_port()}\n")
    proc = subprocess.Popen(
        [sys.executable, "-m", "qmgrd", "-c", str(cfg), "run"],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        Output(proc).wait_for("daemon started")
        yield cfg, tmp_path / "spool"
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(TIMEOUT)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(TIMEOUT)
        if proc.stdout is not None:
            proc.stdout.close()


def test_status_flush_and_postsuper_against_qmgrd_run(running: tuple[Path, Path]) -> None:
    """status/flush/hold/delete talk to the running daemon over its 0660 socket; exit codes hold."""
    cfg, spool = running
    sock = spool / "public" / "qmgrd.sock"
    assert stat.S_IMODE(os.lstat(sock).st_mode) == 0o660

    done = _qmgrd(cfg, "status")
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout.startswith("qmgrd: pid ")
    assert "queue files: incoming 0, active 0, deferred 0, hold 0, corrupt 0" in done.stdout
    done = _qmgrd(cfg, "status", "--json")
    status = json.loads(done.stdout)
    assert status["queue_files"] == {
        "incoming": 0, "active": 0, "deferred": 0, "hold": 0, "corrupt": 0
    }
    assert isinstance(status["pid"], int) and status["uptime"] >= 0

    assert _qmgrd(cfg, "flush").returncode == 0
    done = _qmgrd(cfg, "flush", "-s", "example.com")
    assert (done.returncode, done.stdout) == (
        0, "qmgrd: example.com: retrying 0 deferred messages\n"
    )
    done = _qmgrd(cfg, "hold", "ALL")
    assert (done.returncode, done.stdout) == (0, "qmgrd: Placed on hold: 0 messages\n")
    done = _qmgrd(cfg, "delete", "-", stdin="AAAAAAAAAAAAAAA\n")
    assert done.returncode == 1
    assert done.stderr == "qmgrd: warning: AAAAAAAAAAAAAAA: no such message\n"


def test_status_without_daemon_is_one_line_exit_1(tmp_path: Path) -> None:
    """With no daemon, status fails with exit 1 and one line naming the socket."""
    cfg = _config(tmp_path, _free_port())
    done = _qmgrd(cfg, "status")
    sock = (tmp_path / "etc" / ".." / "spool" / "public" / "qmgrd.sock")
    assert done.returncode == 1
    assert done.stdout == ""
    assert done.stderr.startswith("qmgrd: fatal: the daemon is not running (no control socket at ")
    assert done.stderr.count("\n") == 1
    assert Path(done.stderr.split(" at ", 1)[1].rstrip(")\n")).resolve() == sock.resolve()
