"""``qmgrd qshape [queue...] [--by sender]``: Postfix's qshape table from the spool.

The table shows where the queue's mail is going (or, ``--by sender``, where
it comes from) and how old it is: one row per domain, sorted by total, after a
TOTAL row; the column ``T`` is the row's total and the others are age buckets
in minutes. A bucket's label is its upper limit: with the defaults (first
bucket 5 minutes, 10 buckets, each twice as long as the one before) the
columns are ``5 10 20 40 80 160 320 640 1280 1280+``: "5" counts mail younger
than 5 minutes, "10" mail from 5 to 10 minutes old, ..., "1280+" the rest::

                T 5 10 20 40 80 160 320 640 1280 1280+
          TOTAL 4 2  0  0  1  0   0   0   0    0     1
    example.com 3 2  0  0  0  0   0   0   0    0     1
    example.net 1 0  0  0  1  0   0   0   0    0     0

Recipient shape counts recipients not yet done (there can be more
recipients than messages); sender shape counts messages, each once, under its
sender's domain (``MAILER-DAEMON`` for the null sender). Age is ``now`` minus
the message's arrival time, as in Postfix's qshape. Works on the spool
directly, like mailq; files that vanish meanwhile are skipped. Recipients are
read in batches, so a huge message costs bounded memory. Domains come from
outside: non-printable characters in them are escaped when the table is
printed (``qmgrd.textsafe.printable``), never counted differently.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from qmgrd.errors import SpoolError
from qmgrd.spool import Spool
from qmgrd.textsafe import printable

__all__ = [
    "DEFAULT_QUEUES",
    "SHAPE_QUEUES",
    "Shape",
    "bucket_labels",
    "bucket_of",
    "compute_shape",
    "format_shape",
    "qshape_command",
]

SHAPE_QUEUES = ("incoming", "active", "deferred", "hold")
DEFAULT_QUEUES = ("incoming", "active")  # qshape's default, like Postfix
_BATCH = 1000
_NULL_SENDER = "MAILER-DAEMON"


@dataclass(frozen=True, slots=True)
class Shape:
    """A qshape table: bucket labels, the TOTAL row and the domain rows (sorted)."""

    labels: tuple[str, ...]
    total: tuple[int, ...]  # per bucket
    rows: tuple[tuple[str, tuple[int, ...]], ...]  # (domain, per-bucket counts)


def bucket_labels(bucket_minutes: int = 5, buckets: int = 10) -> tuple[str, ...]:
    """``("5", "10", ..., "1280", "1280+")`` for the defaults."""
    if bucket_minutes < 1 or buckets < 2:
        raise ValueError("qshape needs bucket time >= 1 minute and >= 2 buckets")
    limits = [bucket_minutes << i for i in range(buckets - 1)]
    return (*(str(x) for x in limits), f"{limits[-1]}+")


def bucket_of(age: float, bucket_minutes: int = 5, buckets: int = 10) -> int:
    """The bucket index of a message ``age`` seconds old (negative ages count as new)."""
    limit = bucket_minutes * 60.0
    index = 0
    while index < buckets - 1 and age >= limit:
        limit *= 2
        index += 1
    return index


def _domain(address: str) -> str:
    return address.rpartition("@")[2].lower() if "@" in address else address.lower()


def compute_shape(
    spool: Spool,
    queues: Sequence[str],
    *,
    by_sender: bool,
    now: float,
    bucket_minutes: int = 5,
    buckets: int = 10,
) -> Shape:
    """Count the mail in ``queues`` by domain and age (see the module doc)."""
    labels = bucket_labels(bucket_minutes, buckets)
    counts: dict[str, list[int]] = {}
    total = [0] * buckets
    for queue in queues:
        for queue_id in spool.list_ids(queue):
            try:
                qf = spool.open(queue, queue_id)
                bucket = bucket_of(now - qf.arrival_time, bucket_minutes, buckets)
                if by_sender:
                    domains = [_domain(qf.sender) if qf.sender else _NULL_SENDER]
                else:
                    domains = []
                    offset = qf.first_recipient_offset
                    while offset:
                        batch, offset = qf.read_recipients(offset, _BATCH)
                        domains.extend(_domain(r.address) for r in batch)
            except (SpoolError, FileNotFoundError):
                continue  # moved or removed meanwhile
            for domain in domains:
                row = counts.get(domain)
                if row is None:
                    row = counts[domain] = [0] * buckets
                row[bucket] += 1
                total[bucket] += 1
    rows = sorted(counts.items(), key=lambda item: (-sum(item[1]), item[0]))
    return Shape(labels, tuple(total), tuple((d, tuple(c)) for d, c in rows))


def format_shape(shape: Shape) -> str:
    """The table as qshape prints it: right-aligned columns separated by one space."""
    table: list[list[str]] = [["", "T", *shape.labels]]
    for name, row in (("TOTAL", shape.total), *shape.rows):
        table.append([printable(name), str(sum(row)), *(str(n) for n in row)])
    widths = [max(len(line[col]) for line in table) for col in range(len(table[0]))]
    return "".join(
        " ".join(cell.rjust(width) for cell, width in zip(line, widths, strict=True)) + "\n"
        for line in table
    )


def qshape_command(
    queue_directory: Path,
    queues: Sequence[str],
    *,
    by_sender: bool,
    out: TextIO,
    now: float,
    bucket_minutes: int = 5,
    buckets: int = 10,
) -> int:
    """``qmgrd qshape``: print the table for ``queues`` (default incoming and active); 0."""
    shape = compute_shape(
        Spool(queue_directory),
        queues or DEFAULT_QUEUES,
        by_sender=by_sender,
        now=now,
        bucket_minutes=bucket_minutes,
        buckets=buckets,
    )
    out.write(format_shape(shape))
    return 0
