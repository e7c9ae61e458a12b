"""Damaged and foreign queue files at the spool level: refused with SpoolError, never followed."""

from __future__ import annotations

import contextlib
import json
import os
import threading
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from structlog.testing import capture_logs

from qmgrd.errors import SpoolError
from qmgrd.spool import (
    Envelope,
    QueueFile,
    QueueFileContent,
    ReasonRecord,
    RecipientSpec,
    Spool,
    mark_done,
    new_queue_id,
)
from qmgrd.spool.records import REC_RCPT, encode_record

_fuzz = settings(
    max_examples=300,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)


def _envelope(n_rcpt: int = 3) -> Envelope:
    return Envelope(
        sender="s@src.test",
        recipients=tuple(
            RecipientSpec(f"r{i}@dst.test", "rfc822;o@x" if i % 2 else None, frozenset({"DELAY"}))
            for i in range(n_rcpt)
        ),
        arrival_time=1_700_000_000.25,
        envid="ENV1",
        ret="HDRS",
        client_name="c.test",
        client_addr="127.0.0.1",
        helo="c.test",
        warn_time=1_700_014_400,
    )


@pytest.fixture
def good(spool: Spool) -> bytes:
    """The bytes of one valid queue file."""
    qid = spool.commit(_envelope(), b"Subject: x\r\n\r\nbody\r\n.\r\n")
    data = spool.path("incoming", qid).read_bytes()
    spool.remove("incoming", qid)
    return data


def _place(spool: Spool, data: bytes, queue: str = "incoming") -> Path:
    path = spool.path(queue, new_queue_id())
    path.write_bytes(data)
    return path


def _read_everything(path: Path) -> None:
    """Open, page through every recipient and read the content: what the engine does."""
    qf = QueueFile.open(path)
    qf.read_all_recipients()
    QueueFileContent.of(qf).read()


def test_every_truncation_of_a_valid_file_is_refused(spool: Spool, good: bytes) -> None:
    """Each proper prefix of a queue file (including the empty file) raises SpoolError on open."""
    path = _place(spool, b"")
    for cut in range(len(good)):
        path.write_bytes(good[:cut])
        with pytest.raises(SpoolError):
            QueueFile.open(path)
    path.write_bytes(good)
    _read_everything(path)  # the whole file is fine


@_fuzz
@given(data=st.data())
def test_mutated_files_raise_only_spool_errors(
    spool: Spool, good: bytes, data: st.DataObject
) -> None:
    """Random byte flips, insertions and cuts either parse or raise SpoolError, nothing else."""
    buf = bytearray(good)
    for _ in range(data.draw(st.integers(1, 6))):
        op = data.draw(st.sampled_from(["flip", "insert", "delete"]))
        pos = data.draw(st.integers(0, max(0, len(buf) - 1)))
        if op == "flip" and buf:
            buf[pos] = data.draw(st.integers(0, 255))
        elif op == "insert":
            buf[pos:pos] = data.draw(st.binary(min_size=1, max_size=8))
        elif buf:
            del buf[pos : pos + data.draw(st.integers(1, 8))]
    path = _place(spool, bytes(buf))
    with contextlib.suppress(SpoolError):
        _read_everything(path)


@_fuzz
@given(blob=st.binary(max_size=400))
def test_garbage_files_raise_only_spool_errors(spool: Spool, blob: bytes) -> None:
    """Arbitrary bytes (with a plausible first record or not) never escape as another error."""
    for data in (blob, b"C?" + blob):
        path = _place(spool, data)
        with pytest.raises(SpoolError):
            _read_everything(path)


def test_huge_length_fields_are_refused_without_allocating(spool: Spool, good: bytes) -> None:
    """A sender record claiming 2**62 bytes fails fast with SpoolError instead of MemoryError."""
    qf_path = _place(spool, good)
    qf = QueueFile.open(qf_path)
    # Rebuild the file with a bogus varint length on the T record, keeping the size record valid.
    size_rec = good[:65]
    huge = bytes([0xFF] * 8 + [0x3F])  # varint of about 2**62
    rest = good[65:]
    bogus = size_rec + b"T" + huge + rest[2:]
    path = _place(spool, bogus)
    with pytest.raises(SpoolError):
        QueueFile.open(path)
    # And a recipient record with a huge length, reached by read_recipients.
    off = qf.first_recipient_offset
    bogus_rcpt = good[:off] + b"R" + huge + good[off + 2 :]
    path2 = _place(spool, bogus_rcpt)
    with pytest.raises(SpoolError):
        _read_everything(path2)


def test_negative_size_record_fields_are_refused(spool: Spool, good: bytes) -> None:
    """A size record with negative offset/size that still sums to the file size is refused."""
    n = len(good)
    fields = b"%15d %15d %15d %15d" % (n + 98, -100, 3, 0)
    path = _place(spool, good[:2] + fields + good[65:])
    with pytest.raises(SpoolError, match="negative"):
        QueueFile.open(path)


def test_unknown_record_types_are_refused(spool: Spool, good: bytes) -> None:
    """An unknown record type among the envelope or among the recipients raises SpoolError."""
    qf = QueueFile.open(_place(spool, good))
    off = qf.read_all_recipients()[1].offset  # the second R: the envelope parse stops at the first
    # In the envelope: change the T record type byte (just after the 65-byte size record).
    in_envelope = good[:65] + b"Z" + good[66:]
    with pytest.raises(SpoolError, match="unexpected record type"):
        QueueFile.open(_place(spool, in_envelope))
    # Among recipients: the envelope parses, reading recipients fails.
    in_rcpts = good[:off] + b"Z" + good[off + 1 :]
    qf2 = QueueFile.open(_place(spool, in_rcpts))
    with pytest.raises(SpoolError, match="unexpected record type"):
        qf2.read_all_recipients()


def test_symlink_is_refused_and_its_target_never_written(spool: Spool, good: bytes) -> None:
    """A queue-id symlink to a valid queue file is refused by open, read and mark_done."""
    target = spool.root / "elsewhere"
    target.write_bytes(good)
    link = spool.path("incoming", new_queue_id())
    link.symlink_to(target)
    with pytest.raises(SpoolError, match="symbolic link"):
        QueueFile.open(link)
    qf = QueueFile.open(target)
    with pytest.raises(SpoolError):
        mark_done(link, [qf.first_recipient_offset])
    with pytest.raises(SpoolError):
        QueueFileContent(link, qf.content_offset, qf.content_size).read()
    assert target.read_bytes() == good


def test_fifo_and_directory_are_refused_without_blocking(spool: Spool) -> None:
    """A FIFO (no writer) and a directory under a queue id are refused at once, not waited on."""
    fifo = spool.path("incoming", new_queue_id())
    os.mkfifo(fifo)
    directory = spool.path("incoming", new_queue_id())
    directory.mkdir()
    errors: list[str] = []

    def probe() -> None:
        for path in (fifo, directory):
            try:
                QueueFile.open(path)
            except SpoolError as exc:
                errors.append(str(exc))

    thread = threading.Thread(target=probe, daemon=True)
    thread.start()
    thread.join(5)
    assert not thread.is_alive(), "open() blocked on a FIFO"
    assert len(errors) == 2 and all("not a regular file" in e for e in errors)


def test_sweep_moves_foreign_entries_and_keeps_mail(spool: Spool, good: bytes) -> None:
    """sweep_foreign moves links, FIFOs, directories and stray names to corrupt/, keeps the rest."""
    keep = _place(spool, good, "deferred")
    target = spool.root / "target"
    target.write_bytes(good)
    link = spool.path("incoming", new_queue_id())
    link.symlink_to(target)
    dangling = spool.path("hold", new_queue_id())
    dangling.symlink_to(spool.root / "nowhere")
    fifo = spool.path("active", new_queue_id())
    os.mkfifo(fifo)
    subdir = spool.path("deferred", new_queue_id())
    subdir.mkdir()
    stray = spool.root / "hold" / "README"
    stray.write_text("not mail")
    temp = spool.root / "incoming" / ".tmpfile"
    temp.write_bytes(b"partial")
    with capture_logs() as logs:
        moved = spool.sweep_foreign()
    assert moved == 5
    names = {e["file"] for e in logs if e["event"].startswith("foreign file")}
    assert names == {
        f"incoming/{link.name}",
        f"hold/{dangling.name}",
        f"active/{fifo.name}",
        f"deferred/{subdir.name}",
        "hold/README",
    }
    assert keep.exists() and temp.exists() and target.read_bytes() == good
    corrupt = spool.root / "corrupt"
    assert (corrupt / link.name).is_symlink()  # the link itself, not a copy of its target
    assert sorted(os.listdir(corrupt)) == sorted(
        [link.name, dangling.name, fifo.name, subdir.name, "README"]
    )
    assert spool.sweep_foreign() == 0  # idempotent


def test_sweep_never_overwrites_an_earlier_corrupt_file(spool: Spool) -> None:
    """A foreign name already present in corrupt/ gets a suffix instead of replacing it."""
    (spool.root / "corrupt" / "README").write_text("first")
    (spool.root / "hold" / "README").write_text("second")
    assert spool.sweep_foreign() == 1
    assert (spool.root / "corrupt" / "README").read_text() == "first"
    assert (spool.root / "corrupt" / "README~1").read_text() == "second"


def test_due_ids_lists_dangling_symlinks_and_scans_do_not_follow(spool: Spool) -> None:
    """A dangling queue-id symlink in deferred/ is reported due (so it gets quarantined)."""
    link = spool.path("deferred", new_queue_id())
    link.symlink_to(spool.root / "nowhere")
    assert spool.due_ids("deferred", now=4e9) == [link.name]
    assert spool.list_ids("deferred") == [link.name]


def test_temp_sweep_survives_a_directory_named_like_a_temporary(spool: Spool) -> None:
    """remove_temp_files deletes temp files, logs and skips a directory instead of failing."""
    (spool.root / "incoming" / ".deadwriter").write_bytes(b"x")
    (spool.root / "incoming" / ".weird").mkdir()
    with capture_logs() as logs:
        assert spool.remove_temp_files() == 1
    assert any(e["event"] == "cannot remove stray temporary file" for e in logs)
    assert (spool.root / "incoming" / ".weird").is_dir()


def test_moving_a_vanished_file_is_both_spool_and_not_found_error(spool: Spool) -> None:
    """Spool.move of a missing file raises an error callers can catch as FileNotFoundError."""
    with pytest.raises(FileNotFoundError):
        spool.move(new_queue_id(), "incoming", "active")
    with pytest.raises(SpoolError):
        spool.move(new_queue_id(), "incoming", "active")


def test_malformed_reason_lines_are_skipped_with_a_warning(spool: Spool) -> None:
    """Garbage lines in a bounce log are skipped (logged); the good records are still returned."""
    qid = new_queue_id()
    good = ReasonRecord("a@x", "5.1.1", "failed", "550 no", 1.0)
    spool.append_reasons("bounce", qid, [good])
    with open(spool.root / "bounce" / qid, "ab") as f:
        f.write(b"not json\n[1,2]\n")
        f.write(
            json.dumps(
                {"address": 1, "dsn": "x", "action": "failed", "reason": "r", "time": 1}
            ).encode()
            + b"\n"
        )
        f.write(
            json.dumps(
                {
                    "address": "b",
                    "dsn": "x",
                    "action": "failed",
                    "reason": "r",
                    "time": float("inf"),
                }
            ).encode()
            + b"\n"
        )
    spool.append_reasons("bounce", qid, [good])
    with capture_logs() as logs:
        records = spool.read_reasons("bounce", qid)
    assert records == [good, good]
    assert sum(e["event"] == "malformed reason record skipped" for e in logs) == 4


def test_symlinked_reason_log_is_refused(spool: Spool) -> None:
    """A reason log that is a symlink (e.g. to /dev/zero) raises SpoolError instead of reading."""
    qid = new_queue_id()
    (spool.root / "defer" / qid).symlink_to("/dev/zero")
    with pytest.raises(SpoolError):
        spool.read_reasons("defer", qid)


def test_recipient_record_with_overrunning_orcpt_is_refused(spool: Spool, good: bytes) -> None:
    """An R record whose ORCPT length runs past the record raises SpoolError when read."""
    qf = QueueFile.open(_place(spool, good))
    off = qf.first_recipient_offset
    # Replace the first recipient by one claiming a 100-byte ORCPT inside a 3-byte payload.
    bad = encode_record(REC_RCPT, bytes([0x80, 100, 65]))
    old_len = good[off + 1]
    data = good[:off] + bad + good[off + 2 + old_len :]
    # Keep the size record consistent with the new length.
    delta = len(bad) - (2 + old_len)
    size, offset, count, flags = (int(x) for x in good[2:65].split())
    data = data[:2] + b"%15d %15d %15d %15d" % (size, offset + delta, count, flags) + data[65:]
    qf2 = QueueFile.open(_place(spool, data))
    with pytest.raises(SpoolError, match="ORCPT"):
        qf2.read_all_recipients()
