"""The delivery channel: a ``DeliveryRequest`` and its ``DeliveryResult`` as one line each.

Contract
--------
One ``socketpair`` per delivery worker, the framing of ``qmgrd.daemon.ipc``
(a JSON array per line). The content is not sent: a request names the queue
file and the byte range of the content (``QueueFileContent``), and the
worker opens and streams the file itself (it is in ``active/`` until every
entry of the message is done, which the queue manager decides).

=================================================================  ===============================
``["d", n, queue_id, transport, nexthop, sender, path, offset,     queue manager -> worker: deliver
size, flags, envid, ret, [[address, offset, orcpt, notify], ...]]``  (``flags``: 1 SMTPUTF8, 2
                                                                   8BITMIME, 4 cache load, 8 cache
                                                                   store; ``notify``: comma list)
``["k", n]``                                                       queue manager -> worker: the
                                                                   delivery was cancelled
                                                                   (shutdown): stop it
``["r", n, [[i, outcome, dsn, reply, relay], ...], hop_dsn,         worker -> queue manager: the
hop_reason, setup, transmission, extra, throttle]``                 result; ``i`` indexes the
                                                                   request's recipients, ``outcome``
                                                                   ``s``/``d``/``b``; no hop: null
``["x", n, error]``                                                worker -> queue manager: the
                                                                   agent raised (a crash) or the
                                                                   worker could not deliver
=================================================================  ===============================

``n`` is the queue manager's number for the request, unique per worker.
``LineWriter(writer)`` queues lines and writes them once per loop turn (one
send for the requests or results of a turn, not one each).
``encode_request`` / ``decode_request`` and ``encode_result`` /
``decode_result`` are exact inverses (a unit test pins it). ``decode_result``
maps results back onto the request's own ``Recipient`` objects (the
dispatcher matches results by identity) and raises ``ValueError`` for a
malformed line, an index out of range or a recipient given twice.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from qmgrd.daemon.ipc import encode
from qmgrd.delivery.agent import (
    DeliveryRequest,
    DeliveryResult,
    HopStatus,
    Outcome,
    Recipient,
    RecipientResult,
)
from qmgrd.spool import QueueFileContent
from qmgrd.spool.content import Runner

__all__ = ["LineWriter", "decode_request", "decode_result", "encode_request", "encode_result"]

_SMTPUTF8, _8BITMIME, _LOAD, _STORE = 1, 2, 4, 8
_OUTCOME = {Outcome.SENT: "s", Outcome.DEFERRED: "d", Outcome.BOUNCED: "b"}
_OUTCOME_OF = {v: k for k, v in _OUTCOME.items()}


def encode_request(n: int, request: DeliveryRequest, content: QueueFileContent) -> bytes:
    """The ``d`` line of ``request`` (its content is ``content``'s file range)."""
    flags = (
        (_SMTPUTF8 if request.smtputf8 else 0)
        | (_8BITMIME if request.body_8bitmime else 0)
        | (_LOAD if request.cache_load else 0)
        | (_STORE if request.cache_store else 0)
    )
    rcpts = [[r.address, r.offset, r.orcpt, ",".join(sorted(r.notify))] for r in request.recipients]
    return encode(
        "d", n, request.queue_id, request.transport, request.nexthop, request.sender,
        str(content.path), content.offset, content.size, flags, request.envid, request.ret, rcpts,
    )  # fmt: skip


def decode_request(fields: list[Any], run: Runner | None = None) -> tuple[int, DeliveryRequest]:
    """The number and request of a ``d`` message (``ValueError`` if malformed); ``run``: the
    content's first read's thread hop (``QueueFileContent.run``)."""
    if len(fields) != 13:
        raise ValueError(f"bad delivery request: {fields[:3]!r}")
    _, n, queue_id, transport, nexthop, sender, path, offset, size, flags, envid, ret = fields[:12]
    rcpts = fields[12]
    recipients = tuple(
        Recipient(str(a), int(o), None if c is None else str(c), _notify(k)) for a, o, c, k in rcpts
    )
    content = QueueFileContent(Path(str(path)), int(offset), int(size), run)
    return int(n), DeliveryRequest(
        queue_id=str(queue_id),
        transport=str(transport),
        nexthop=str(nexthop),
        sender=str(sender),
        recipients=recipients,
        content=content,
        smtputf8=bool(flags & _SMTPUTF8),
        body_8bitmime=bool(flags & _8BITMIME),
        envid=None if envid is None else str(envid),
        ret=None if ret is None else str(ret),
        cache_load=bool(flags & _LOAD),
        cache_store=bool(flags & _STORE),
    )


def encode_result(n: int, request: DeliveryRequest, result: DeliveryResult) -> bytes:
    """The ``r`` line of ``result`` (its recipients as indexes into ``request``'s)."""
    index = {id(r): i for i, r in enumerate(request.recipients)}
    rows = [
        [index[id(r.recipient)], _OUTCOME[r.outcome], r.dsn, r.reply, r.relay]
        for r in result.recipients
        if id(r.recipient) in index  # one the agent made up: the dispatcher ignores it too
    ]
    hop = result.hop
    return encode(
        "r", n, rows, hop.dsn if hop else None, hop.reason if hop else None,
        result.conn_setup_time, result.transmission_time, result.extra, result.throttle,
    )  # fmt: skip


def decode_result(fields: list[Any], recipients: tuple[Recipient, ...]) -> DeliveryResult:
    """The result an ``r`` message carries, on ``recipients`` (``ValueError`` if malformed)."""
    if len(fields) != 9:
        raise ValueError(f"bad delivery result: {fields[:2]!r}")
    _, _n, rows, hop_dsn, hop_reason, setup, transmission, extra, throttle = fields
    seen: set[int] = set()
    out: list[RecipientResult] = []
    for i, outcome, dsn, reply, relay in rows:
        if not isinstance(i, int) or not 0 <= i < len(recipients) or i in seen:
            raise ValueError(f"bad recipient index in a delivery result: {i!r}")
        seen.add(i)
        if outcome not in _OUTCOME_OF:
            raise ValueError(f"bad outcome in a delivery result: {outcome!r}")
        out.append(
            RecipientResult(recipients[i], _OUTCOME_OF[outcome], str(dsn), str(reply), str(relay))
        )
    if throttle not in (None, "full", "rate") or not isinstance(extra, dict):
        raise ValueError(f"bad delivery result: throttle {throttle!r}")
    hop = None if hop_dsn is None else HopStatus(str(hop_dsn), str(hop_reason))
    if throttle is not None and hop is None:
        raise ValueError("bad delivery result: a throttle without a hop status")
    return DeliveryResult(
        tuple(out),
        hop,
        float(setup),
        float(transmission),
        {str(k): str(v) for k, v in extra.items()},
        throttle,
    )


def _notify(text: object) -> frozenset[str]:
    return frozenset(w for w in str(text).split(",") if w)




class LineWriter:
    """Lines written to ``writer`` together, once per loop turn (module doc)."""

    __slots__ = ("_due", "_lines", "writer")

    def __init__(self, writer: asyncio.StreamWriter) -> None:
        self.writer = writer
        self._lines: list[bytes] = []
        self._due = False

    def write(self, line: bytes) -> None:
        """Queue ``line``; it is written at the end of this loop turn."""
        self._lines.append(line)
        if not self._due:
            self._due = True
            asyncio.get_running_loop().call_soon(self.flush)

    def flush(self) -> None:
        """Write what is queued now (dropped if the channel is closed)."""
        self._due = False
        lines, self._lines = self._lines, []
        if lines and not self.writer.is_closing():
            self.writer.write(b"".join(lines))
