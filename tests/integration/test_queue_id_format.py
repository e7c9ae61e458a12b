"""enable_long_queue_ids through the daemon: the id in the SMTP reply, the spool and mailq."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from qmgrd.spool.mailq import format_json, scan_queue
from tests.integration.e2e import running_daemon
from tests.support.config import free_port, write_config

SHORT = re.compile(r"[0-9A-F]{12}")
LONG = re.compile(r"[0-9B-DF-HJ-NP-TV-Zb-df-hj-np-tv-z]{10}z[0-9B-DF-HJ-NP-TV-Zb-df-hj-np-tv-y]{4}")


@pytest.mark.parametrize(
    ("setting", "pattern"),
    [("", SHORT), ("enable_long_queue_ids = no", SHORT), ("enable_long_queue_ids = yes", LONG)],
)
async def test_the_parameter_chooses_the_format_of_new_ids(
    tmp_path: Path, setting: str, pattern: re.Pattern[str]
) -> None:
    """Postfix's default gives short hex ids; 'yes' gives long ids, in reply, spool and mailq."""
    # Nothing listens on the relay port: the message is deferred and stays queued.
    conf = write_config(tmp_path, f"relayhost = [127.0.0.1]:{free_port()}\n{setting}")
    with capture_logs():
        async with running_daemon(conf) as d:
            qid = await d.submit("s@src.test", ["r@dst.test"])
            await d.wait_idle()
            assert pattern.fullmatch(qid), qid
            assert d.queue_ids("deferred") == [qid]
            (obj,) = [json.loads(x) for x in format_json(scan_queue(d.spool)).splitlines()]
            assert obj["queue_id"] == qid and obj["queue_name"] == "deferred"
