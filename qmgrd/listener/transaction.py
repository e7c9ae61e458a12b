"""A session's mail transaction: the queue file from MAIL to the end of DATA.

``TransactionIO`` is a part of ``qmgrd.listener.session.Session`` (moved
here to keep that module short; its docstring describes the behaviour): the
spool room check at MAIL, the writer and its worker-thread disk work, DATA's
reception through cleanup into the file, and the abort that leaves no file.
It holds no state of its own: the attributes declared below are Session's.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from qmgrd.cleanup import Disposition, HeaderProcessor, MessageInfo, protocol_name
from qmgrd.errors import SpoolError
from qmgrd.listener.flowgate import FlowFacts
from qmgrd.listener.protocol import Closed, Content, DataEnd, Dialogue, Event, ServerProtocol
from qmgrd.listener.room import SpoolRoom
from qmgrd.spool.writer import EnvelopeHead, QueueFileWriter

if TYPE_CHECKING:
    from qmgrd.listener.session import ListenerContext
    from qmgrd.listener.settings import ListenerSettings
    from qmgrd.listener.tls import TlsFacts

_REJECT = Disposition.REJECT  # read once (an enum member read through its class costs)
_MIN_FREE = 65536  # spool bytes MAIL wants free even with queue_minfree = 0 (a queue file)


@dataclass(slots=True, eq=False)
class Transaction:
    """The state between MAIL and the end of DATA."""

    sender: str
    smtputf8: bool
    file: QueueFileWriter  # the queue file being written
    failed: bool = False  # a spool write failed: 451 until the transaction ends
    given: list[str] = field(default_factory=list)  # accepted recipients as sent (Received:)
    cleanup: HeaderProcessor | None = None  # DATA's header processing (settings.cleanup)
    facts: FlowFacts | None = None  # MAIL's flow facts, for the gate at commit


class TransactionIO:
    """The transaction half of ``Session`` (module docstring)."""

    __slots__ = ("_disk", "data_bytes", "txn")  # assigned here; the rest are Session's

    # Session's attributes and methods used here.
    ctx: ListenerContext
    settings: ListenerSettings
    txn: Transaction | None
    dialogue: Dialogue
    proto: ServerProtocol
    log: Any
    client: str
    client_addr: str
    tls: TlsFacts | None
    sasl_user: str | None
    data_bytes: int
    _disk: asyncio.Future[None] | None

    async def next_event(self) -> Event:
        raise NotImplementedError  # Session's

    def spool_has_room(self, size: int) -> bool:
        """Whether the spool's file system can take a message of ``size`` bytes now.

        The process's ``SpoolRoom`` asks the file system (``qmgrd.listener.room``:
        an answer with plenty of room is reused for a short while).
        """
        room = self.ctx.room
        if room is None:
            room = self.ctx.room = SpoolRoom(str(self.ctx.committer.spool.root))
        return room.has_room(max(self.settings.queue_minfree, _MIN_FREE) + size)

    def begin_transaction(self, head: EnvelopeHead, facts: FlowFacts | None = None) -> None:
        writer = QueueFileWriter(self.ctx.committer.spool, head, recycler=self.ctx.recycler)
        self.txn = Transaction(head.sender, head.smtputf8, writer, facts=facts)
        self.dialogue.move("mail")

    async def disk(self, func: Callable[[], None]) -> None:
        """Run the queue file's disk work in a thread; it completes even if we are cancelled.

        ``abort_transaction`` waits for it before removing the file, so a
        flush can never write to a descriptor that was closed (and reused).
        """
        work = asyncio.ensure_future(asyncio.to_thread(func))
        self._disk = work
        await asyncio.shield(work)

    async def abort_transaction(self) -> None:
        """Drop the transaction in progress and its temporary file, if any."""
        txn, self.txn = self.txn, None
        if txn is None:
            return
        if self._disk is not None and not self._disk.done():
            await asyncio.wait({self._disk})
        if self.dialogue.in_transaction:
            self.dialogue.move("reset")
        await self.disk(txn.file.discard)

    async def write_out(self, txn: Transaction) -> bool:
        """Flush the writer's buffer if full; False (logged, writer gone) on a spool error."""
        if not txn.file.needs_flush:
            return True
        try:
            await self.disk(txn.file.flush)
        except SpoolError as exc:
            self.log.warning("queue file write error", client=self.client, reason=str(exc))
            txn.failed = True
            return False
        return True

    def start_cleanup(self, txn: Transaction) -> None:
        """DATA: the header processor (Received:, checks, missing headers) for this message."""
        cleanup = self.settings.cleanup
        if cleanup is None:
            return
        tls = self.tls is not None
        auth = self.sasl_user is not None
        local = self.settings.local_client(self.client_addr, sasl=auth)
        txn.cleanup = HeaderProcessor(
            cleanup,
            MessageInfo(
                queue_id=txn.file.queue_id,
                sender=txn.sender,
                recipients=tuple(txn.given),
                now=self.ctx.clock(),
                local=local,
                helo=self.dialogue.helo_name,
                client_addr=self.client_addr,
                protocol=protocol_name(esmtp=self.dialogue.extended, tls=tls, auth=auth),
            ),
            self.ctx.cleanup_log,
        )

    async def read_data(self, txn: Transaction) -> tuple[bool, bool]:
        """Receive the message into the writer; (too big, write failed) at the end marker.

        With cleanup, the content goes through ``txn.cleanup`` on its way to the
        file; ``message_size_limit`` counts the client's bytes.
        """
        limit = self.settings.message_size_limit
        too_big = False
        cleanup = txn.cleanup
        txn.file.begin_content()
        self.proto.start_data()
        self.data_bytes = 0
        while True:
            event = await self.next_event()
            if isinstance(event, DataEnd):
                if cleanup is not None and not (too_big or txn.failed):
                    self._store(txn, cleanup.finish())
                return too_big, txn.failed
            if isinstance(event, Closed):
                raise ConnectionResetError("connection closed during DATA")
            if not isinstance(event, Content):
                continue
            self.data_bytes += len(event.data)
            if too_big or txn.failed:
                continue
            if limit and self.data_bytes > limit:
                too_big = True
                await self.disk(txn.file.discard)  # keep reading, store nothing more
                continue
            if cleanup is None:
                self._store(txn, event.data)
            else:  # the header section's bytes, then the body's as received (no join)
                head, body = cleanup.feed_parts(event.data)
                if head:
                    self._store(txn, head)
                if body:
                    self._store(txn, body)
            await self.write_out(txn)

    @staticmethod
    def _store(txn: Transaction, data: bytes | memoryview) -> None:
        """Append content, unless cleanup already refused the message (it cannot change)."""
        if txn.cleanup is None or txn.cleanup.outcome.disposition is not _REJECT:
            txn.file.add_content(data)
