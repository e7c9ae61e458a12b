"""``qmgrd run`` with configurations it must refuse: at start (exit 1) and on SIGHUP (kept)."""

from __future__ import annotations

import os
import select
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TIMEOUT = 30


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _config(tmp_path: Path, extra: str = "") -> Path:
    cfg = tmp_path / "etc"
    cfg.mkdir()
    (cfg / "main.cf").write_text(
        f"queue_directory = ../spool\nsmtpd_listen = 127.0.0.1:{_free_port()}\n"
        f"myhostname = mx.test\n{extra}"
    )
    (cfg / "master.cf").write_text((REPO / "config" / "master.cf").read_text())
    return cfg


def _wait_for(fd: int, needle: bytes, seen: bytearray) -> None:
    """Read the daemon's output until ``needle`` appears (bounded by TIMEOUT)."""
    deadline = time.monotonic() + TIMEOUT
    while needle not in seen:
        remaining = deadline - time.monotonic()
        ready, _, _ = select.select([fd], [], [], max(remaining, 0))
        chunk = os.read(fd, 65536) if ready else b""
        if not chunk:
            raise AssertionError(f"no {needle!r} in output: {bytes(seen)!r}")
        seen += chunk


def test_start_refuses_a_postfix_parameter_it_cannot_honour(tmp_path: Path) -> None:
    """body_checks at start: exit 1, one line naming file, line, parameter; spool untouched."""
    cfg = _config(tmp_path, "body_checks = regexp:/etc/postfix/body_checks\n")
    proc = subprocess.run(
        [sys.executable, "-m", "qmgrd", "-c", str(cfg), "run"],
        cwd=REPO,
        capture_output=True,
        timeout=TIMEOUT,
        check=False,
    )
    assert proc.returncode == 1
    assert proc.stderr.decode().startswith(
        f"qmgrd: fatal: {cfg / 'main.cf'}, line 4: parameter body_checks: "
        "qmgrd does not implement Postfix parameter body_checks"
    )
    assert b"Traceback" not in proc.stderr
    assert not (tmp_path / "spool").exists()


def test_reload_refuses_start_only_and_unsupported_changes(tmp_path: Path) -> None:
    """SIGHUP with a new queue_directory, then with body_checks: both refused, daemon runs on."""
    cfg = _config(tmp_path)
    proc = subprocess.Popen(
        [sys.executable, "-m", "qmgrd", "-c", str(cfg), "run"],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    assert proc.stdout is not None
    fd, seen = proc.stdout.fileno(), bytearray()
    try:
        _wait_for(fd, b"daemon started", seen)
        main_cf = cfg / "main.cf"
        original = main_cf.read_text()
        main_cf.write_text(original.replace("../spool", "../other-spool"))
        proc.send_signal(signal.SIGHUP)
        _wait_for(fd, b"queue_directory cannot change on reload", seen)
        main_cf.write_text(original + "body_checks = regexp:/etc/qmgrd/body_checks\n")
        proc.send_signal(signal.SIGHUP)
        _wait_for(fd, b"parameter body_checks: qmgrd does not implement", seen)
        assert seen.count(b"reload refused") == 2
        assert not (tmp_path / "other-spool").exists()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(TIMEOUT) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(TIMEOUT)
        proc.stdout.close()
