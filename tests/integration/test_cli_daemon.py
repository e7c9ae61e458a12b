"""The operator CLI as separate processes against ``qmgrd run`` (what an operator types)."""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.config import free_port, write_config
from tests.support.process import qmgrd, running_daemon_process


@pytest.fixture
def running(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    """``qmgrd run`` in a subprocess, relaying to a port nobody listens on (mail defers)."""
    conf = write_config(
        tmp_path,
        f"relayhost = [127.0.0.1]:{free_port()}\n",
        listen=f"127.0.0.1:{free_port()}",
        queue_directory="../spool",
    )
    with running_daemon_process(conf):
        yield conf, tmp_path / "spool"


def test_status_flush_and_postsuper_against_qmgrd_run(running: tuple[Path, Path]) -> None:
    """status/flush/hold/delete talk to the running daemon over its 0660 socket; exit codes hold."""
    cfg, spool = running
    sock = spool / "public" / "qmgrd.sock"
    assert stat.S_IMODE(os.lstat(sock).st_mode) == 0o660

    done = qmgrd(cfg, "status")
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout.startswith("qmgrd: pid ")
    assert "queue files: incoming 0, active 0, deferred 0, hold 0, corrupt 0" in done.stdout
    done = qmgrd(cfg, "status", "--json")
    status = json.loads(done.stdout)
    assert status["queue_files"] == {
        "incoming": 0, "active": 0, "deferred": 0, "hold": 0, "corrupt": 0
    }
    assert isinstance(status["pid"], int) and status["uptime"] >= 0

    assert qmgrd(cfg, "flush").returncode == 0
    done = qmgrd(cfg, "flush", "-s", "example.com")
    assert (done.returncode, done.stdout) == (
        0, "qmgrd: example.com: retrying 0 deferred messages\n"
    )
    done = qmgrd(cfg, "hold", "ALL")
    assert (done.returncode, done.stdout) == (0, "qmgrd: Placed on hold: 0 messages\n")
    done = qmgrd(cfg, "delete", "-", stdin="AAAAAAAAAAAAAAA\n")
    assert done.returncode == 1
    assert done.stderr == "qmgrd: warning: AAAAAAAAAAAAAAA: no such message\n"


def test_status_without_daemon_is_one_line_exit_1(tmp_path: Path) -> None:
    """With no daemon, status fails with exit 1 and one line naming the socket."""
    cfg = write_config(tmp_path, listen=f"127.0.0.1:{free_port()}", queue_directory="../spool")
    done = qmgrd(cfg, "status")
    sock = (tmp_path / "etc" / ".." / "spool" / "public" / "qmgrd.sock")
    assert done.returncode == 1
    assert done.stdout == ""
    assert done.stderr.startswith("qmgrd: fatal: the daemon is not running (no control socket at ")
    assert done.stderr.count("\n") == 1
    assert Path(done.stderr.split(" at ", 1)[1].rstrip(")\n")).resolve() == sock.resolve()
