"""The unit's ExecStart run by hand the way systemd runs it, with listener worker processes.

systemd itself does not run here, so the test plays its part from ``systemd/qmgrd.service``:
the ExecStart line (the installed script pointed at this checkout's virtualenv and a test
configuration), ``Type=notify`` with ``NotifyAccess=main`` (every sd_notify datagram must
come from the main pid: the socket reads the sender's credentials, as systemd does),
``ExecReload=/bin/kill -HUP $MAINPID`` and the default ``KillMode=control-group`` (SIGTERM
to every process of the service at once: a process group of its own stands for the cgroup).
"""

from __future__ import annotations

import os
import re
import signal
import sys
from pathlib import Path

from qmgrd.config import load_config
from qmgrd.daemon.workers import worker_count
from tests.support.config import REPO, free_port, write_config
from tests.support.process import DaemonProcess

TIMEOUT = 60.0  # the unit's TimeoutStopSec
UNIT = REPO / "systemd" / "qmgrd.service"


def _directive(name: str) -> str:
    match = re.search(rf"^{name}=(.+)$", UNIT.read_text(), re.MULTILINE)
    assert match, name
    return match.group(1)


def test_the_units_execstart_with_auto_workers_fits_its_notify_and_kill_settings(
    tmp_path: Path,
) -> None:
    """READY=1 after every worker listens, RELOADING=1 then READY=1 on SIGHUP, STOPPING=1 on
    SIGTERM: each from the main pid (NotifyAccess=main); the workers are the main process's
    children in its group (cgroup) and never notify; SIGTERM to the whole group at once
    stops everything with exit 0, no restart attempted, nothing left behind."""
    assert _directive("Type") == "notify" and _directive("NotifyAccess") == "main"
    assert not re.search(r"^KillMode=", UNIT.read_text(), re.MULTILINE)  # control-group
    port = free_port()
    conf = write_config(
        tmp_path,
        f"smtpd_worker_processes = auto\nmaillog_file = {tmp_path / 'maillog'}\n",
        listen=f"127.0.0.1:{port}",
    )
    script = str(Path(sys.executable).with_name("qmgrd"))
    argv = (
        _directive("ExecStart")
        .replace("/opt/qmgrd/bin/qmgrd", script)
        .replace("/etc/qmgrd", str(conf))
        .split()
    )
    expected = worker_count(load_config(conf))
    assert expected == (os.cpu_count() or 1)
    daemon = DaemonProcess(conf, argv=argv, new_session=True)
    try:
        daemon.start()
        main = daemon.proc.pid
        daemon.wait_ready(TIMEOUT)
        workers = daemon.children()
        assert len(workers) == (expected if expected > 1 else 0)
        assert daemon.group() == sorted([main, *workers])
        daemon.send_signal(signal.SIGHUP)  # ExecReload
        daemon.wait_notify("RELOADING=1", TIMEOUT)
        daemon.wait_notify("READY=1", TIMEOUT)
        daemon.signal_group(signal.SIGTERM)  # KillMode=control-group
        daemon.wait_notify("STOPPING=1", TIMEOUT)
        assert daemon.proc.wait(TIMEOUT) == 0
        assert set(daemon.senders) == {main}, (daemon.senders, daemon.notifications)
        assert daemon.group() == []
        log = (tmp_path / "maillog").read_text()
        assert "restarting it" not in log
        assert "killed" not in log
    finally:
        daemon.close()
