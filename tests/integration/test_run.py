"""``qmgrd -c DIR run`` end to end: a subprocess that accepts mail and stops on a signal."""

from __future__ import annotations

import os
import signal
import smtplib
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiosmtpd.controller import Controller

from tests.support.config import free_port, write_config
from tests.support.process import DaemonProcess, qmgrd, running_daemon_process

TIMEOUT = 30


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
    controller = Controller(recorder, hostname="127.0.0.1", port=free_port())
    controller.start()
    try:
        yield recorder, controller.port
    finally:
        controller.stop()


@pytest.fixture
def daemon(
    tmp_path: Path, sink: tuple[_Recorder, int]
) -> Iterator[tuple[DaemonProcess, int, Path]]:
    """``qmgrd run`` relaying to the sink, ready (it said READY=1); its port and spool."""
    port = free_port()
    conf = write_config(
        tmp_path,
        f"relayhost = [127.0.0.1]:{sink[1]}\n",
        listen=f"127.0.0.1:{port}",
        queue_directory="../spool",  # relative: taken from the configuration directory
    )
    with running_daemon_process(conf) as proc:
        yield proc, port, tmp_path / "spool"


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_run_accepts_mail_and_stops_cleanly(
    daemon: tuple[DaemonProcess, int, Path],
    sink: tuple[_Recorder, int],
    signum: signal.Signals,
) -> None:
    """The daemon creates its spool, queues and relays a message, and exits 0 on the signal."""
    out, port, spool = daemon
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
    [(sender, rcpts, content)] = sink[0].envelopes
    assert (sender, rcpts) == ("s@example.com", ["r@example.com"])
    # cleanup added its Received: (with the queue id) and, for a loopback client, the
    # missing Date:, From: and Message-Id: headers
    assert content.startswith(b"Received: from ") and f" id {queue_id}".encode() in content
    assert b"\r\nSubject: x\r\n" in content and content.endswith(b"\r\n\r\nhi\r\n")
    assert out.stop(signum) == 0
    for name in ("incoming", "active", "deferred"):
        assert os.listdir(spool / name) == []


def test_run_with_port_in_use_fails_with_one_line(tmp_path: Path) -> None:
    """A listen address already taken is an operator error: exit 1, one line, no traceback."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        conf = write_config(tmp_path, listen=f"127.0.0.1:{taken.getsockname()[1]}")
        proc = qmgrd(conf, "run")
    assert proc.returncode == 1
    assert "smtpd_listen" in proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout


def test_run_notifies_systemd_serves_metrics_and_survives_a_bad_reload(
    tmp_path: Path, sink: tuple[_Recorder, int]
) -> None:
    """READY=1 after binding, /metrics parses, SIGHUP with a broken main.cf keeps the old config."""
    from urllib.request import urlopen

    from prometheus_client.parser import text_string_to_metric_families

    port, metrics_port = free_port(), free_port()
    conf = write_config(
        tmp_path,
        f"relayhost = [127.0.0.1]:{sink[1]}\nmetrics_listen = 127.0.0.1:{metrics_port}\n",
        listen=f"127.0.0.1:{port}",
    )
    with running_daemon_process(conf) as out:  # returns once READY=1 arrived
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
        (conf / "main.cf").write_text((conf / "main.cf").read_text() + "soft_bounce = maybe\n")
        out.send_signal(signal.SIGHUP)
        out.wait_notify("RELOADING=1")
        out.wait_for("reload refused")
        out.wait_notify("READY=1")
        assert out.stop(signal.SIGTERM) == 0
        out.wait_notify("STOPPING=1")
    expected = ["READY=1", "RELOADING=1", "READY=1", "STOPPING=1"]
    assert len(out.notifications) == len(expected), out.notifications
    assert all(state in m.split("\n") for state, m in zip(expected, out.notifications, strict=True))
