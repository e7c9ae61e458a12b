"""qmgrd expire end to end: the CLI through the control socket of a running daemon."""

from __future__ import annotations

from pathlib import Path

from structlog.testing import capture_logs

from tests.integration.sinks import SinkConfig, smtp_sink
from tests.integration.test_cli_ops import cli, daemon


async def test_expire_all_deferred_returns_them_through_the_daemon(tmp_path: Path) -> None:
    """`qmgrd expire ALL deferred`: each deferred message is returned to its sender now
    (the notice reaches the sink), none is delivered, and the queue is empty."""
    sink_cfg = SinkConfig(rcpt_replies={f"r{i}@dst.test": (450, "4.2.0 later") for i in range(2)})
    with capture_logs():
        async with smtp_sink(sink_cfg) as sink, daemon(
            tmp_path, f"relayhost = {sink.nexthop}"
        ) as (d, conf):
            ids = [await d.submit("s@src.test", [f"r{i}@dst.test"]) for i in range(2)]
            await d.wait_idle()
            assert sorted(d.queue_ids("deferred")) == sorted(ids)
            assert await cli(conf, "expire", "ALL", "deferred") == (
                0, "qmgrd: Expired: 2 messages\n", ""
            )
            await d.wait_idle()
            assert d.queue_ids("deferred") == [] and d.queue_ids("active") == []
    notices = [m for m in sink.messages if m.mail_from in ("", "<>")]
    assert sorted(r for m in notices for r in m.rcpt_tos) == ["s@src.test", "s@src.test"]
    assert all(b"message is administratively expired" in m.content for m in notices)
    assert len(sink.messages) == 2  # the 450s were never accepted: only the notices
