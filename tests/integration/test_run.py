"""``qmgrd -c DIR run`` end to end: a subprocess that accepts mail and stops on a signal."""

from __future__ import annotations

import os
import select
import signal
import smtplib
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiosmtpd.controller import Controller

REPO = Path(__file__).resolve().parents[2]
TIMEOUT = 30


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _config(tmp_path: Path, port: int, extra: str = "") -> Path:
    cfg = tmp_path / "etc"
    cfg.mkdir()
    (cfg / "main.cf").write_text(
        f"queue_directory = ../spool\nsmtpd_listen = 127.0.0.1:{port}\n"
        f"myhostname = mx.test\n{extra}"
    )
    (cfg / "master.cf").write_text((REPO / "config" / "master.cf").read_text())
    return cfg


class Output:
    """The daemon's stdout, read unbuffered (os.read) so select() never misses a line."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        assert proc.stdout is not None
        self.fd = proc.stdout.fileno()
        self.pending = b""

    def wait_for(self, needle: str) -> list[str]:
        """Lines up to and including the first one containing ``needle`` (bounded by TIMEOUT)."""
        lines: list[str] = []
        deadline = time.monotonic() + TIMEOUT
        while True:
            while b"\n" in self.pending:
                raw, self.pending = self.pending.split(b"\n", 1)
                lines.append(raw.decode())
                if needle in lines[-1]:
                    return lines
            remaining = deadline - time.monotonic()
            ready, _, _ = select.select([self.fd], [], [], max(remaining, 0))
            chunk = os.read(self.fd, 65536) if ready else b""
            if not chunk:
                raise AssertionError(f"no {needle!r} in output: {lines}")
            self.pending += chunk


class _Recorder:
    """aiosmtpd handler that keeps every envelope it receives."""

    def __init__(self) -> None:
        self.envelopes: list[tuple[str, list[str], bytes]] = []

    async def handle_DATA(self, _server: object, _session: object, envelope: Any) -> str:
        self.envelopes.append((envelope.mail_from, list(envelope.rcpt_tos), envelope.content))
        return "250 2.0.0 Ok: stored"


@pytest.fixture
def sink() -> Iterator[tuple[_Recorder, int]]:
    """A thread-run SMTP sink on 127.0.0.1 that the daemon relays to."""
    recorder = _Recorder()
    controller = Controller(recorder, hostname="127.0.0.1", port=_free_port())
    controller.start()
    try:
        yield recorder, controller.port
    finally:
        controller.stop()


@pytest.fixture
def daemon(
    tmp_path: Path, sink: tuple[_Recorder, int]
) -> Iterator[tuple[subprocess.Popen[bytes], Output, int, Path]]:
    port = _free_port()
    cfg = _config(tmp_path, port, f"relayhost = [127.0.0.1]:{sink[1]}\n")
    proc = subprocess.Popen(
        [sys.executable, "-m", "qmgrd", "-c", str(cfg), "run"],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        yield proc, Output(proc), port, tmp_path / "spool"
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(TIMEOUT)
        if proc.stdout is not None:
            proc.stdout.close()


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_run_accepts_mail_and_stops_cleanly(
    daemon: tuple[subprocess.Popen[bytes], Output, int, Path],
    sink: tuple[_Recorder, int],
    signum: signal.Signals,
) -> None:
    """The daemon creates its spool, queues and relays a message, and exits 0 on the signal."""
    proc, out, port, spool = daemon
    out.wait_for("daemon started")
    for name in ("incoming", "active", "deferred", "hold", "corrupt", "defer", "bounce"):
        assert (spool / name).is_dir()
    with smtplib.SMTP("127.0.0.1", port, timeout=TIMEOUT) as client:
        client.sendmail("s@example.com", ["r@example.com"], b"Subject: x\r\n\r\nhi\r\n")
    lines = out.wait_for("nrcpt=1")
    queue_id = lines[-1].split(":", 1)[0]
    assert lines[-1].startswith(f"{queue_id}: client=unknown[127.0.0.1], from=<s@example.com>")
    sent = out.wait_for("status=sent")[-1]
    assert sent.startswith(f"{queue_id}: to=<r@example.com>, relay=127.0.0.1[127.0.0.1]:")
    out.wait_for(f"{queue_id}: removed")
    assert sink[0].envelopes == [("s@example.com", ["r@example.com"], b"Subject: x\r\n\r\nhi\r\n")]
    proc.send_signal(signum)
    assert proc.wait(TIMEOUT) == 0
    for name in ("incoming", "active", "deferred"):
        assert os.listdir(spool / name) == []


def test_run_with_port_in_use_fails_with_one_line(tmp_path: Path) -> None:
    """A listen address already taken is an operator error: exit 1, one line, no traceback."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        cfg = _config(tmp_path, taken.getsockname()[1])
        proc = subprocess.run(
            [sys.executable, "-m", "qmgrd", "-c", str(cfg), "run"],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=TIMEOUT,
            check=False,
        )
    assert proc.returncode == 1
    assert "smtpd_listen" in proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout


def test_run_notifies_systemd_serves_metrics_and_survives_a_bad_reload(
    tmp_path: Path, sink: tuple[_Recorder, int]
) -> None:
    """READY=1 after binding, /metrics parses, SIGHUP with a broken main.cf keeps the old config."""
    from urllib.request import urlopen

    from prometheus_client.parser import text_string_to_metric_families

    port, metrics_port = _free_port(), _free_port()
    cfg = _config(
        tmp_path,
        port,
        f"relayhost = [127.0.0.1]:{sink[1]}\nmetrics_listen = 127.0.0.1:{metrics_port}\n",
    )
    notify_path = tmp_path / "notify.sock"
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify.bind(str(notify_path))
    notify.settimeout(TIMEOUT)
    proc = subprocess.Popen(
        [sys.executable, "-m", "qmgrd", "-c", str(cfg), "run"],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env={**os.environ, "PYTHONUNBUFFERED": "1", "NOTIFY_SOCKET": str(notify_path)},
    )
    try:
        out = Output(proc)
        assert b"READY=1" in notify.recv(4096)
        with smtplib.SMTP("127.0.0.1", port, timeout=TIMEOUT) as client:
            client.sendmail("s@example.com", ["r@example.com"], b"Subject: x\r\n\r\nhi\r\n")
        out.wait_for("removed")
        with urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=TIMEOUT) as reply:
            text = reply.read().decode()
        families = {f.name: f for f in text_string_to_metric_families(text)}
        delivered = [
            s
            for f in families.values()
            for s in f.samples
            if s.labels.get("status") == "sent" and s.name.endswith("_total")
        ]
        assert delivered and sum(s.value for s in delivered) == 1
        (cfg / "main.cf").write_text((cfg / "main.cf").read_text() + "soft_bounce = maybe\n")
        proc.send_signal(signal.SIGHUP)
        assert b"RELOADING=1" in notify.recv(4096)
        out.wait_for("reload refused")
        assert b"READY=1" in notify.recv(4096)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(TIMEOUT) == 0
        assert b"STOPPING=1" in notify.recv(4096)
    finally:
        notify.close()
        if proc.poll() is None:
            proc.kill()
        proc.wait(TIMEOUT)
        if proc.stdout is not None:
            proc.stdout.close()
