"""``write_config``: the ``main.cf`` and ``master.cf`` of a test daemon.

The files go to ``root/etc``; the spool is ``root/spool`` unless the test
names another ``queue_directory`` (a relative one is taken from ``etc``, as
the daemon does). ``master.cf`` is the one the project ships
(``config/master.cf``: smtp, relay, discard, error, retry) plus ``master``.
``main.cf`` names the host ``mx.test``, listens on ``listen`` (127.0.0.1 port 0
by default: the OS picks a free port) and keeps the SMTP client's connect and
command timeouts short so a broken test fails in seconds; ``main`` is
appended, and a later line overrides an earlier one.

Listener processes: ``qmgrd run`` started on these files runs the product's
default, ``smtpd_worker_processes = auto`` (one listener worker per core),
unless ``workers`` is given: a test that depends on the listener running in
the queue manager's process (its pid on smtpd log lines, no child process)
passes ``workers=1``; one that needs workers passes their number. (Tests
that build ``assemble.Daemon`` themselves listen in process whatever the
file says: ``Daemon(workers=0)``.)
"""

from __future__ import annotations

import socket
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SHIPPED_MASTER_CF = REPO / "config" / "master.cf"


def write_config(
    root: Path,
    main: str = "",
    *,
    master: str = "",
    listen: str = "127.0.0.1:0",
    queue_directory: Path | str | None = None,
    workers: int | str | None = None,
) -> Path:
    """Write ``root/etc/{main,master}.cf`` (see the module docstring); returns ``root/etc``."""
    conf = root / "etc"
    conf.mkdir(parents=True, exist_ok=True)
    spool = root / "spool" if queue_directory is None else queue_directory
    (conf / "main.cf").write_text(
        f"queue_directory = {spool}\n"
        f"smtpd_listen = {listen}\n"
        "myhostname = mx.test\n"
        "smtp_helo_name = mx.test\n"
        "smtp_connect_timeout = 5s\n"
        "smtp_helo_timeout = 10s\n"
        "smtp_mail_timeout = 10s\n"
        "smtp_rcpt_timeout = 10s\n"
        "smtp_data_done_timeout = 10s\n"
        + ("" if workers is None else f"smtpd_worker_processes = {workers}\n")
        + f"{main}\n"
    )
    (conf / "master.cf").write_text(SHIPPED_MASTER_CF.read_text() + master)
    return conf


def free_port() -> int:
    """A loopback port that was free a moment ago (for a daemon in another process)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
