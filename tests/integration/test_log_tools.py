"""Postfix log tools on qmgrd's logs: pflogsumm counts a real run; syslog_name tags the lines.

The pflogsumm test runs only where Debian's ``pflogsumm`` is installed
(``apt-get install pflogsumm``); it is skipped elsewhere.
"""

from __future__ import annotations

import os
import re
import select
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import aiosmtplib
import pytest

from qmgrd.log import configure_logging
from tests.integration.e2e import TIMEOUT, running_daemon, wait_for_messages, write_config
from tests.integration.sinks import SinkConfig, smtp_sink
from tests.support.logs import saved_structlog

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def restore_structlog() -> Iterator[None]:
    """The test configures logging globally; put the previous configuration back."""
    with saved_structlog():
        yield


def _grand_totals(report: str) -> dict[str, int]:
    """pflogsumm's "Grand Totals" counts by their label (received, delivered, ...)."""
    totals: dict[str, int] = {}
    for m in re.finditer(r"^\s+(\d+)\s+(received|delivered|deferred|bounced|rejected)\b",
                         report, re.M):
        totals.setdefault(m.group(2), int(m.group(1)))
    return totals


@pytest.mark.skipif(shutil.which("pflogsumm") is None, reason="pflogsumm is not installed")
async def test_pflogsumm_counts_a_mixed_run(tmp_path: Path) -> None:
    """pflogsumm --syslog-name=qmgrd counts the received, sent, deferred, bounced, rejected mail."""
    maillog = tmp_path / "maillog"
    output = configure_logging("postfix", maillog_file=maillog, hostname="mx")
    replies = {
        "soft@dst.test": (450, "4.2.0 mailbox busy, try later"),
        "hard@dst.test": (550, "5.1.1 no such user"),
    }
    async with smtp_sink(SinkConfig(rcpt_replies=replies)) as sink:
        # Only 127.0.0.1 may relay: a client on 127.0.0.2 is refused (relay access denied).
        conf = write_config(
            tmp_path, main=f"relayhost = [127.0.0.1]:{sink.port}\nmynetworks = 127.0.0.1/32"
        )
        async with running_daemon(conf) as d:
            await d.submit("s@src.test", ["ok1@dst.test"])
            await d.submit("s@src.test", ["ok2@dst.test", "hard@dst.test"])
            await d.submit("s@src.test", ["soft@dst.test"])
            async with aiosmtplib.SMTP(
                hostname="127.0.0.1",
                port=d.port,
                source_address=("127.0.0.2", 0),
                timeout=TIMEOUT,
                start_tls=False,
            ) as client:
                with pytest.raises(aiosmtplib.SMTPRecipientsRefused):
                    await client.sendmail("x@outside.test", ["victim@dst.test"], b"\r\nhi\r\n")
            # ok1, ok2, and the bounce to s@src.test for hard@dst.test
            await wait_for_messages(sink, 3)
            await d.wait_idle()
    output.close()
    report = subprocess.run(
        ["pflogsumm", "--syslog-name=qmgrd", "--problems-first", str(maillog)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    totals = _grand_totals(report)
    assert totals == {
        "received": 3,  # the three accepted over SMTP (the bounce is not "received")
        "delivered": 3,  # ok1, ok2 and the non-delivery notification
        "deferred": 1,
        "bounced": 1,
        "rejected": 1,
    }, report
    assert "no such user" in report
    assert "Relay access denied" in report


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_syslog_name_tags_every_line_of_the_daemon(tmp_path: Path) -> None:
    """``qmgrd run`` with syslog_name = postfix-out writes postfix-out/<component>[pid] lines."""
    cfg = tmp_path / "etc"
    cfg.mkdir()
    (cfg / "main.cf").write_text(
        f"queue_directory = ../spool\nsmtpd_listen = 127.0.0.1:{_free_port()}\n"
        "myhostname = mx.test\nmaillog_file = /dev/stdout\nsyslog_name = postfix-out\n"
    )
    (cfg / "master.cf").write_text((REPO / "config" / "master.cf").read_text())
    proc = subprocess.Popen(
        [sys.executable, "-m", "qmgrd", "-c", str(cfg), "run"],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    assert proc.stdout is not None
    seen = bytearray()
    try:
        deadline = time.monotonic() + TIMEOUT
        while b"daemon started" not in seen and time.monotonic() < deadline:
            ready, _, _ = select.select([proc.stdout], [], [], deadline - time.monotonic())
            chunk = os.read(proc.stdout.fileno(), 65536) if ready else b""
            if not chunk:
                break
            seen += chunk
    finally:
        proc.terminate()
        proc.wait(TIMEOUT)
        proc.stdout.close()
    text = seen.decode()
    assert f" mx postfix-out/master[{proc.pid}]: daemon started" in text, text
    assert " mx qmgrd/" not in text
