"""One read of a small message's content for all its deliveries in flight.

Contract
--------
A message with recipients at several destinations is handed out as several
entries at once (ten destinations: ten deliveries), and each agent reads the
content from the queue file: an open, a read and a close in a worker thread,
and a thread hop shared with other spool work, per delivery. ``SharedReads``
makes that one read per message:

- ``content(msg)`` is the ``QueueFileContent`` for a delivery of ``msg``
  and counts the delivery in; ``release(msg, content)`` counts it out (the
  dispatcher calls it when the agent returns, whatever happened). A message
  whose content the load holds (``ActiveMessage.content``, the load's one
  read) gets it with no read at all, and content larger than
  ``SHARE_LIMIT`` bytes the plain ``QueueFileContent`` (its reads are not
  shared): neither is counted. So a shared read is for small messages the
  load could not hold (its budget was spent).
- The first delivery to read submits the read (``QueueFileContent``'s first
  read: open, read, close) and awaits it; deliveries that ask while it runs wait
  for it; later ones get the bytes at once. Only a read that returned the
  whole content with its file already closed is shared; otherwise (an error,
  a short read, a cancelled first reader) each waiting delivery reads for
  itself, exactly as without this module, so a failure is reported by every
  delivery it concerns.
- The bytes are dropped when the message's last delivery in flight is
  released: memory is bounded by the deliveries in flight times
  ``SHARE_LIMIT``.

The file cannot change under a shared read: a message's content is never
rewritten while it is in the active queue (only its done marks and W record,
outside the content range).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from qmgrd.daemon.table import ActiveMessage
from qmgrd.errors import InvariantError
from qmgrd.spool import QueueFileContent
from qmgrd.spool.content import Runner

__all__ = ["SHARE_LIMIT", "SharedReads"]

# Content up to this size is read once per message (the agents' first chunk is larger, so
# such a read is always the whole content, its file closed in the worker thread).
SHARE_LIMIT = 64 * 1024

_Read = tuple[int, bytes]  # QueueFileContent's first read: (fd or -1, bytes)


@dataclass(slots=True, eq=False)
class _Shared:
    """The read of one message's content, with the deliveries that use it."""

    users: int = 0
    data: bytes | None = None  # the whole content, once read
    reading: bool = False  # a delivery's read is under way
    waiters: list[asyncio.Future[bytes | None]] = field(default_factory=list)


class SharedReads:
    """Shares the content read among a message's deliveries in flight (module doc)."""

    def __init__(self, submit: Runner) -> None:
        """``submit``: runs a blocking callable in a worker thread (the spool's ``IoBatcher``)."""
        self.submit = submit
        self._reads: dict[str, _Shared] = {}

    def __len__(self) -> int:
        """Messages with deliveries counted in."""
        return len(self._reads)

    def content(self, msg: ActiveMessage) -> QueueFileContent:
        """The content of a delivery of ``msg``; counted in when it is small (module doc)."""
        qf = msg.qf
        if msg.content is not None or qf.content_size > SHARE_LIMIT:
            return QueueFileContent(
                msg.path, qf.content_offset, qf.content_size, run=self.submit, data=msg.content
            )
        qid = msg.queue_id
        shared = self._reads.get(qid)
        if shared is None:
            shared = self._reads[qid] = _Shared()
        shared.users += 1

        async def run(fn: Callable[[], Any]) -> _Read:
            return await self._read(shared, fn)

        return QueueFileContent(msg.path, qf.content_offset, qf.content_size, run=run)

    def release(self, msg: ActiveMessage, content: QueueFileContent) -> None:
        """The delivery of ``msg`` that got ``content`` ended; the bytes go with the last one
        (module doc)."""
        if content.data is not None or content.size > SHARE_LIMIT:
            return  # not counted in
        qid = msg.queue_id
        shared = self._reads.get(qid)
        if shared is None or shared.users < 1:
            raise InvariantError(f"{qid}: content released more often than handed out")
        shared.users -= 1
        if shared.users == 0:
            del self._reads[qid]

    async def _read(self, shared: _Shared, fn: Callable[[], Any]) -> _Read:
        if shared.data is not None:
            return -1, shared.data
        if shared.reading:
            waiter: asyncio.Future[bytes | None] = asyncio.get_running_loop().create_future()
            shared.waiters.append(waiter)
            data = await waiter
            if data is not None:
                return -1, data
            result: _Read = await self.submit(fn)
            return result
        shared.reading = True
        data = None
        try:
            result = await self.submit(fn)
            if result[0] == -1:  # the whole content, the file closed: shareable
                data = shared.data = result[1]
            return result
        finally:
            shared.reading = False
            waiters, shared.waiters = shared.waiters, []
            for waiter in waiters:
                if not waiter.done():
                    waiter.set_result(data)  # None: read for yourself
