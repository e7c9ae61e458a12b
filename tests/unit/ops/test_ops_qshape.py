"""qshape: age buckets, recipient and sender shapes, row order and the table layout."""

from __future__ import annotations

import io

import pytest

from qmgrd.ops.qshape import (
    Shape,
    bucket_labels,
    bucket_of,
    compute_shape,
    format_shape,
    qshape_command,
)
from qmgrd.spool import Envelope, RecipientSpec, Spool, mark_done

NOW = 1_700_000_000.0
MIN = 60.0


def _commit(spool: Spool, sender: str, rcpts: list[str], age: float) -> str:
    env = Envelope(sender, tuple(RecipientSpec(r) for r in rcpts), NOW - age)
    return spool.commit(env, b"x")


def test_default_labels() -> None:
    """The default columns are Postfix's: 5 10 20 ... 1280 1280+."""
    assert bucket_labels() == (
        "5", "10", "20", "40", "80", "160", "320", "640", "1280", "1280+"
    )
    assert bucket_labels(1, 3) == ("1", "2", "2+")


@pytest.mark.parametrize(
    ("minutes", "bucket"),
    [
        (-3, 0),
        (0, 0),
        (4.99, 0),
        (5, 1),
        (9.99, 1),
        (10, 2),
        (639.9, 7),
        (640, 8),
        (1279.9, 8),
        (1280, 9),
        (100_000, 9),
    ],
)
def test_bucket_edges(minutes: float, bucket: int) -> None:
    """A bucket holds ages below its label and at or above the previous label."""
    assert bucket_of(minutes * MIN) == bucket


def test_recipient_shape_counts_live_recipients_by_domain(spool: Spool) -> None:
    """Each not-done recipient counts once, under its lower-cased domain and the message's age."""
    a = _commit(spool, "s@src.test", ["r1@example.com", "r2@Example.COM", "x@example.net"], 1 * MIN)
    _commit(spool, "", ["r@example.net"], 30 * MIN)
    old = _commit(spool, "s@src.test", ["r3@example.com"], 2000 * MIN)
    spool.move(old, "incoming", "deferred")
    qf = spool.open("incoming", a)
    mark_done(qf.path, [qf.read_all_recipients()[2].offset], fsync=False)
    shape = compute_shape(spool, ["incoming", "deferred"], by_sender=False, now=NOW)
    assert shape.total == (2, 0, 0, 1, 0, 0, 0, 0, 0, 1)
    assert shape.rows == (
        ("example.com", (2, 0, 0, 0, 0, 0, 0, 0, 0, 1)),
        ("example.net", (0, 0, 0, 1, 0, 0, 0, 0, 0, 0)),
    )


def test_only_named_queues_are_counted(spool: Spool) -> None:
    """A message in a queue not asked for is not counted."""
    held = _commit(spool, "s@src.test", ["r@example.com"], 0)
    spool.move(held, "incoming", "hold")
    assert compute_shape(spool, ["incoming", "active"], by_sender=False, now=NOW).rows == ()
    shape = compute_shape(spool, ["hold"], by_sender=False, now=NOW)
    assert shape.rows == (("example.com", (1, 0, 0, 0, 0, 0, 0, 0, 0, 0)),)


def test_sender_shape_counts_messages(spool: Spool) -> None:
    """--by sender counts each message once under its sender's domain; <> is MAILER-DAEMON."""
    _commit(spool, "a@Src.test", ["r1@example.com", "r2@example.com"], 0)
    _commit(spool, "b@src.test", ["r@example.org"], 50 * MIN)
    _commit(spool, "", ["r@example.org"], 0)
    shape = compute_shape(spool, ["incoming"], by_sender=True, now=NOW)
    assert shape.total == (2, 0, 0, 0, 1, 0, 0, 0, 0, 0)
    assert shape.rows == (
        ("src.test", (1, 0, 0, 0, 1, 0, 0, 0, 0, 0)),
        ("MAILER-DAEMON", (1, 0, 0, 0, 0, 0, 0, 0, 0, 0)),
    )


def test_rows_sorted_by_total_then_name(spool: Spool) -> None:
    """Rows come in decreasing total order; equal totals in name order."""
    _commit(spool, "s@x.test", ["a@b.test", "a@a.test", "b@c.test", "c@c.test"], 0)
    shape = compute_shape(spool, ["incoming"], by_sender=False, now=NOW)
    assert [name for name, _ in shape.rows] == ["c.test", "a.test", "b.test"]


def test_big_message_is_read_in_batches(spool: Spool) -> None:
    """A message with more recipients than one read batch is counted in full."""
    _commit(spool, "s@x.test", [f"r{i}@many.test" for i in range(2500)], 0)
    shape = compute_shape(spool, ["incoming"], by_sender=False, now=NOW)
    assert shape.rows == (("many.test", (2500, 0, 0, 0, 0, 0, 0, 0, 0, 0)),)


def test_table_layout() -> None:
    """Header with T and labels, TOTAL, then rows; columns right-aligned, one space apart."""
    shape = Shape(
        labels=("5", "10", "10+"),
        total=(12, 0, 3),
        rows=(("example.com", (12, 0, 1)), ("x.org", (0, 0, 2))),
    )
    assert format_shape(shape).splitlines() == [
        "             T  5 10 10+",
        "      TOTAL 15 12  0   3",
        "example.com 13 12  0   1",
        "      x.org  2  0  0   2",
    ]


def test_empty_queue_prints_header_and_total(spool: Spool) -> None:
    """An empty queue still prints the header and a zero TOTAL row."""
    out = io.StringIO()
    assert qshape_command(spool.root, [], by_sender=False, out=out, now=NOW) == 0
    assert out.getvalue().splitlines() == [
        "      T 5 10 20 40 80 160 320 640 1280 1280+",
        "TOTAL 0 0  0  0  0  0   0   0   0    0     0",
    ]


def test_command_defaults_to_incoming_and_active(spool: Spool) -> None:
    """Without queue names, qshape shows incoming and active, not deferred."""
    _commit(spool, "s@x.test", ["r@in.test"], 0)
    moved = _commit(spool, "s@x.test", ["r@act.test"], 0)
    spool.move(moved, "incoming", "active")
    deferred = _commit(spool, "s@x.test", ["r@def.test"], 0)
    spool.move(deferred, "incoming", "deferred")
    out = io.StringIO()
    qshape_command(spool.root, [], by_sender=False, out=out, now=NOW, bucket_minutes=1, buckets=2)
    assert out.getvalue().splitlines() == [
        "         T 1 1+",
        "   TOTAL 2 2  0",
        "act.test 1 1  0",
        " in.test 1 1  0",
    ]
