"""The listener worker's channel to the queue manager: one write per pass of the loop."""

from __future__ import annotations

import asyncio
from typing import cast

from qmgrd.daemon.smtpd import Outbox


class _Writer:
    """What Outbox uses of a StreamWriter: write and is_closing."""

    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closing = False

    def write(self, data: bytes) -> None:
        self.writes.append(data)

    def is_closing(self) -> bool:
        return self.closing


async def test_messages_sent_in_one_pass_go_out_in_one_write_in_order() -> None:
    outbox = Outbox()
    writer = _Writer()
    outbox.send(b"dropped: not open yet\n")
    outbox.open(cast(asyncio.StreamWriter, writer))
    for i in range(3):
        outbox.send(b"commit %d\n" % i)
    assert writer.writes == []  # not yet: at the end of this pass
    await asyncio.sleep(0)
    assert writer.writes == [b"commit 0\ncommit 1\ncommit 2\n"]
    outbox.send(b"later\n")
    await asyncio.sleep(0)
    assert writer.writes[1:] == [b"later\n"]


async def test_flush_writes_at_once_and_nothing_goes_to_a_closing_channel() -> None:
    outbox = Outbox()
    writer = _Writer()
    outbox.open(cast(asyncio.StreamWriter, writer))
    outbox.send(b"last counts\n")
    outbox.flush()  # before the channel is closed
    assert writer.writes == [b"last counts\n"]
    await asyncio.sleep(0)  # the scheduled pass finds nothing more
    assert writer.writes == [b"last counts\n"]
    writer.closing = True
    outbox.send(b"too late\n")
    await asyncio.sleep(0)
    assert writer.writes == [b"last counts\n"]
