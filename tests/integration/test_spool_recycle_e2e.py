"""Recycled queue files through the daemon: a delivered message's inode carries the next one."""

from __future__ import annotations

import os
from pathlib import Path

from qmgrd.spool.recycle import RECYCLE_DIR
from tests.integration.e2e import message_bytes, running_daemon
from tests.integration.sinks import smtp_sink
from tests.support.config import write_config


async def test_delivered_files_are_pooled_and_reused_without_old_bytes(tmp_path: Path) -> None:
    """A long message, delivered and pooled; a short one reuses its inode and arrives exact."""
    long_msg = message_bytes("long", size=20_000)
    short_msg = message_bytes("short")
    async with smtp_sink() as sink:
        conf = write_config(tmp_path, main=f"relayhost = {sink.nexthop}")
        async with running_daemon(conf) as d:
            await d.submit("s@src.test", ["a@dst.test"], long_msg)
            await d.wait_idle()
            pool = d.spool.root / RECYCLE_DIR
            (name,) = os.listdir(pool)  # delivered: its file is pooled, not deleted
            inode = os.stat(pool / name).st_ino
            await d.submit("s@src.test", ["b@dst.test"], short_msg)
            await d.wait_idle()
            assert [os.stat(pool / n).st_ino for n in os.listdir(pool)] == [inode]
            for queue in ("incoming", "active", "deferred", "hold", "corrupt"):
                assert d.queue_ids(queue) == [], queue
            assert [n for n in os.listdir(d.spool.root / "incoming")] == []
    contents = [m.content for m in sink.messages]
    assert len(contents) == 2
    assert contents[0].endswith(long_msg.split(b"\r\n\r\n", 1)[1])
    assert contents[1].endswith(short_msg.split(b"\r\n\r\n", 1)[1])
    assert b"Subject: short" in contents[1] and b"x" * 76 not in contents[1]
