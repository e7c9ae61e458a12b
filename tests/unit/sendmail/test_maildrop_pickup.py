"""Maildrop files (untrusted), sendmail's options, and the pickup's exactly-once commit."""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from structlog.testing import capture_logs

from qmgrd.cleanup import AddressRewriter, CleanupSettings, open_header_checks
from qmgrd.daemon.pickup import Pickup
from qmgrd.sendmail.maildrop import (
    MaildropError,
    MaildropMessage,
    encode_maildrop,
    read_maildrop,
    write_maildrop,
)
from qmgrd.sendmail.options import UsageError, parse
from qmgrd.spool import Spool, new_queue_id
from qmgrd.tables import open_table
from tests.support.links import record_placements


def test_options_parse_like_postfix() -> None:
    """Attached and separate arguments, clustered flags, -oi, -q forms, mailq program name."""
    o = parse(["-tiv", "-fme@x", "-F", "Full Name", "-oi", "-Nsuccess,failure", "a@b", "c@d"])
    assert o.extract and o.ignore_dots and o.verbose == 1
    assert o.sender == "me@x" and o.full_name == "Full Name"
    assert o.notify == frozenset({"SUCCESS", "FAILURE"})
    assert o.recipients == ["a@b", "c@d"]
    assert parse(["-qRexample.com"]).flush_site == "example.com"
    assert parse([], program="mailq").mode == "p"
    assert parse(["--", "-notanoption"]).recipients == ["-notanoption"]
    with pytest.raises(UsageError):
        parse(["-k"])


def _message(**kwargs: object) -> MaildropMessage:
    base: dict[str, object] = {"sender": "u", "recipients": ("a@b.example",), "content": b"x"}
    base.update(kwargs)
    return MaildropMessage(**base)  # type: ignore[arg-type]


def _read(data: bytes, directory: Path, limit: int = 1000) -> MaildropMessage:
    path = directory / "f"
    path.write_bytes(data)
    fd = os.open(path, os.O_RDONLY)
    try:
        return read_maildrop(fd, limit)
    finally:
        os.close(fd)


def test_maildrop_round_trip(tmp_path: Path) -> None:
    """What sendmail writes, the pickup reads back identically."""
    m = _message(full_name="N", notify=frozenset({"NEVER"}), ret="HDRS", envid="e1")
    assert _read(encode_maildrop(m), tmp_path) == m


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"garbage\n\nx",
        b"qmgrd-maildrop 1\nS a\n\nx",  # no recipient
        b"qmgrd-maildrop 1\nS a\nT b\nZ c\n\nx",
        b"qmgrd-maildrop 1\nS a\nS b\nT c\n\nx",
        b"qmgrd-maildrop 1\nS a\x01\nT c\n\nx",
        b"qmgrd-maildrop 1\nS \xff\nT c\n\nx",
        b"qmgrd-maildrop 1\nS a\nT c\n\n" + b"x" * 2000,  # over the size limit
    ],
)
def test_maildrop_rejects_bad_files(tmp_path: Path, data: bytes) -> None:
    """Each malformed file is a MaildropError with a reason."""
    with pytest.raises(MaildropError):
        _read(data, tmp_path)


@given(st.binary(max_size=3000))
@settings(max_examples=200, deadline=None)
def test_maildrop_reader_never_raises_otherwise(data: bytes) -> None:
    """Random bytes: a message or MaildropError, nothing else."""
    with tempfile.TemporaryDirectory() as d, contextlib.suppress(MaildropError):
        _read(b"qmgrd-maildrop 1\n" + data, Path(d))


def _settings(checks: str = "") -> CleanupSettings:
    tables = [open_table(checks, base_dir=Path("/"))] if checks else []
    return CleanupSettings(
        myhostname="h.test",
        mail_name="qmgrd",
        rewriter=AddressRewriter(myorigin="origin.test", mydomain="test"),
        header_checks=open_header_checks(tables, "header_checks", Path("/")),
    )


def _pickup(tmp_path: Path, checks: str = "") -> tuple[Pickup, Spool, list[str]]:
    spool = Spool(tmp_path / "spool", fsync=False)
    spool.ensure_dirs()
    notified: list[str] = []
    p = Pickup(
        spool, tmp_path / "maildrop", _settings(checks), notify=notified.append, size_limit=10**6
    )
    p.ensure_dir()
    return p, spool, notified


def test_pickup_commits_under_the_maildrop_name(tmp_path: Path) -> None:
    """The queue file's id is the maildrop file's name; the maildrop file is gone; notified."""
    p, spool, notified = _pickup(tmp_path)
    qid = new_queue_id()
    write_maildrop(p.maildrop, qid, encode_maildrop(_message(content=b"Subject: s\n\nb\n")))
    assert p.scan() == [qid] and notified == [qid]
    assert spool.list_ids("incoming") == [qid]
    qf = spool.open("incoming", qid)
    assert qf.sender == "u@origin.test"
    assert not (p.maildrop / qid).exists()


def test_half_done_pickup_is_recognised(tmp_path: Path) -> None:
    """Committed but not yet removed (a crash): recover() removes it and queues nothing twice."""
    p, spool, _ = _pickup(tmp_path)
    qid = new_queue_id()
    data = encode_maildrop(_message(content=b"Subject: s\n\nb\n"))
    write_maildrop(p.maildrop, qid, data)
    p.scan()
    write_maildrop(p.maildrop, qid, data)  # as if the unlink had not happened
    assert p.recover() == []
    assert spool.list_ids("incoming") == [qid]
    assert not (p.maildrop / qid).exists()


def test_corrupt_and_foreign_files(tmp_path: Path) -> None:
    """A malformed file goes to corrupt/ with a warning; a symlink is not followed."""
    p, spool, _ = _pickup(tmp_path)
    bad = new_queue_id()
    (p.maildrop / bad).write_bytes(b"not a maildrop file")
    target = tmp_path / "secret"
    target.write_bytes(encode_maildrop(_message()))
    os.symlink(target, p.maildrop / new_queue_id())
    with capture_logs() as logs:
        assert p.scan() == []
    assert (spool.root / "corrupt" / bad).exists()
    assert spool.list_ids("incoming") == []
    assert sum("moved to corrupt" in e["event"] for e in logs) == 2
    assert target.exists()


def test_odd_name_gets_a_queue_id(tmp_path: Path) -> None:
    """A file whose name is not a queue id is renamed first, then picked up."""
    p, spool, _ = _pickup(tmp_path)
    (p.maildrop / "handmade").write_bytes(encode_maildrop(_message()))
    [qid] = p.scan()
    assert spool.list_ids("incoming") == [qid]


CHECKS = "regexp:{{/^X-Hold:/ HOLD review}, {/^X-Drop:/ DISCARD}, {/^X-Bad:/ REJECT no}}"


@pytest.mark.parametrize(
    ("header", "queue"),
    [(b"X-Hold: 1", "hold"), (b"X-Drop: 1", None)],
)
def test_pickup_outcomes(
    tmp_path: Path, header: bytes, queue: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """HOLD -> straight into hold/ (never placed in incoming/); DISCARD -> nothing queued."""
    p, spool, notified = _pickup(tmp_path, CHECKS)
    qid = new_queue_id()
    write_maildrop(p.maildrop, qid, encode_maildrop(_message(content=header + b"\n\nb\n")))
    placed = record_placements(monkeypatch)
    p.scan()
    assert notified == []
    assert spool.root / "incoming" / qid not in placed
    if queue == "hold":
        assert placed == [spool.root / "hold" / qid]
    for q in ("incoming", "hold"):
        assert spool.list_ids(q) == ([qid] if q == queue else [])
    assert not (p.maildrop / qid).exists()


def test_pickup_reject_returns_to_sender(tmp_path: Path) -> None:
    """REJECT at pickup: a DSN to the sender under the maildrop id (Postfix bounces it)."""
    p, spool, notified = _pickup(tmp_path, CHECKS)
    qid = new_queue_id()
    write_maildrop(p.maildrop, qid, encode_maildrop(_message(content=b"X-Bad: 1\n\nb\n")))
    p.scan()
    assert notified == [qid] and spool.list_ids("incoming") == [qid]
    qf = spool.open("incoming", qid)
    assert qf.sender == ""
    recipients, _ = qf.read_recipients(qf.first_recipient_offset, 10)
    assert [r.address for r in recipients] == ["u@origin.test"]
    content = (spool.root / "incoming" / qid).read_bytes()
    assert b"Status: 5.7.1" in content and b"Undelivered Mail Returned to Sender" in content


def test_pickup_too_many_hops_returns_to_sender(tmp_path: Path) -> None:
    """hopcount_limit reached at pickup: returned with 5.4.0."""
    p, spool, _ = _pickup(tmp_path)
    qid = new_queue_id()
    hops = b"Received: x\n" * 50
    write_maildrop(p.maildrop, qid, encode_maildrop(_message(content=hops + b"\nb\n")))
    p.scan()
    content = (spool.root / "incoming" / qid).read_bytes()
    assert b"Status: 5.4.0" in content


def test_pickup_reject_with_null_sender_is_held(tmp_path: Path) -> None:
    """Nobody to return it to: a refused null-sender message is held, not lost."""
    p, spool, _ = _pickup(tmp_path, CHECKS)
    qid = new_queue_id()
    msg = _message(sender="", content=b"X-Bad: 1\n\nb\n")
    write_maildrop(p.maildrop, qid, encode_maildrop(msg))
    p.scan()
    assert spool.list_ids("hold") == [qid]
