"""The load's read-ahead: the first recipients of a message, read by the load's own job.

The load's job reads the first ``PREFETCH`` recipients from the same read as
the envelope (``qmgrd.spool.loadread``); ``_from_prefetch(msg, request)``
answers a read request from them (once) exactly as ``read_recipients`` would,
or says it cannot. See ``qmgrd.daemon.loading`` and ``qmgrd.daemon.reading``.
"""

from __future__ import annotations

from qmgrd.core.message import ReadRequest
from qmgrd.core.params import READ_BATCH_LIMIT
from qmgrd.daemon.table import ActiveMessage
from qmgrd.spool import RecipientRecord

__all__ = ["PREFETCH", "Prefetch", "_from_prefetch"]


# Recipients the load's job reads ahead: as many as a read request may ask (the core's
# cap), so the prefetch always answers the first request and every message's first read
# takes the same path (the order messages become ready in stays the order of their loads).
PREFETCH = READ_BATCH_LIMIT
# (offset, the records or the read's exception, next offset), or None.
Prefetch = tuple[int, list[RecipientRecord] | Exception, int] | None


def _from_prefetch(
    msg: ActiveMessage, request: ReadRequest
) -> tuple[list[RecipientRecord], int] | None:
    """What ``read_recipients(request.offset, request.limit)`` returns (or raises), from the
    prefetch if it covers the request (used once), else None."""
    prefetch, msg.prefetch = msg.prefetch, None
    if prefetch is None or prefetch[0] != request.offset or request.limit < 1:
        return None
    _offset, records, next_offset = prefetch
    if isinstance(records, Exception):
        raise records
    if len(records) > request.limit:  # the next R record starts where the read would stop
        return records[: request.limit], records[request.limit].offset
    if len(records) == request.limit or next_offset == 0:
        return records, next_offset
    return None  # the request wants more than was read ahead
