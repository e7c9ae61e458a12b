"""The load's one read of a queue file gives what QueueFile.open, a recipient read, the
file's mode and a content read give, from one open."""

from __future__ import annotations

import errno
import io
import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from qmgrd.errors import SpoolError
from qmgrd.spool import (
    Envelope,
    QueueFile,
    QueueFileContent,
    QueueFileIOError,
    RecipientSpec,
    Spool,
    loadread,
    mark_done,
    mark_forced_expire,
)
from qmgrd.spool.loadread import load_queue_file
from qmgrd.spool.records import (
    RecipientRecord,
    encode_queue_file,
    open_regular_stat,
    recipients_from,
)


@pytest.fixture
def spool(tmp_path: Path) -> Spool:
    s = Spool(tmp_path / "spool", fsync=False)
    s.ensure_dirs()
    return s


def _commit(spool: Spool, rcpts: int, content: bytes) -> Path:
    env = Envelope(
        sender="s@x.test",
        recipients=tuple(RecipientSpec(f"r{i}@y.test", notify=frozenset({"NEVER"}) if i % 2
                                       else frozenset()) for i in range(rcpts)),
        arrival_time=1_000_000_000.5,
        envid="ENV1",
    )
    return spool.path("incoming", spool.commit(env, content))


@pytest.mark.parametrize("size", [10, 40_000, 70_000, 200_000, 300_000])
@pytest.mark.parametrize("limit", [1, 3, 50])
def test_one_read_equals_the_separate_reads(spool: Spool, size: int, limit: int) -> None:
    """Envelope, first recipients (done ones skipped), resume offset and content are what
    the separate reads give, small file or big, content kept only up to ``keep``."""
    content = bytes(range(256)) * (size // 256) + b"end\r\n"
    path = _commit(spool, 7, content)
    every = QueueFile.open(path).read_all_recipients()
    mark_done(path, [every[0].offset, every[3].offset], fsync=False)
    qf = QueueFile.open(path)
    keep = 100_000
    got = load_queue_file(path, limit, keep)
    assert got.qf == qf
    assert (got.recipients, got.next_offset) == qf.read_recipients(
        qf.first_recipient_offset, limit
    )
    assert got.mode == os.stat(path).st_mode
    assert got.content == (content if len(content) <= keep else None)
    assert load_queue_file(path, limit).content is None  # keep 0: nothing held


def test_the_mode_carries_the_forced_expire_mark(spool: Spool) -> None:
    path = _commit(spool, 1, b"x\r\n")
    mark_forced_expire(path)
    assert load_queue_file(path, 10).mode == os.stat(path).st_mode


def test_a_bad_recipient_record_is_kept_as_the_read_would_raise_it(spool: Spool) -> None:
    """A damaged recipient record: the envelope loads, the recipients are the error."""
    path = _commit(spool, 2, b"x\r\n")
    qf = QueueFile.open(path)
    second = qf.read_all_recipients()[1].offset
    data = bytearray(path.read_bytes())
    data[second] = ord("Z")  # not an R or D record
    path.write_bytes(bytes(data))
    got = load_queue_file(path, 10, 1000)
    assert isinstance(got.recipients, SpoolError) and got.next_offset == 0
    with pytest.raises(SpoolError, match="unexpected record type"):
        qf.read_recipients(qf.first_recipient_offset, 10)


def test_system_errors_are_io_errors_and_damage_is_corruption(
    spool: Spool, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = _commit(spool, 1, b"x\r\n")
    link = path.with_name("link")
    link.symlink_to(path)
    with pytest.raises(SpoolError, match="symbolic link") as info:
        load_queue_file(link, 10)
    assert not isinstance(info.value, QueueFileIOError)
    path.write_bytes(path.read_bytes()[:-3])  # truncated
    with pytest.raises(SpoolError) as info:
        load_queue_file(path, 10)
    assert not isinstance(info.value, QueueFileIOError)

    def emfile(path: Path, flags: int, mode: int = 0o600) -> tuple[int, os.stat_result]:
        raise OSError(errno.EMFILE, os.strerror(errno.EMFILE))

    monkeypatch.setattr(loadread, "open_regular_stat", emfile)
    with pytest.raises(QueueFileIOError, match=os.strerror(errno.EMFILE)):
        load_queue_file(path, 10)


async def test_held_content_is_sent_without_reading_the_file(spool: Spool) -> None:
    """QueueFileContent with ``data``: the chunks and read() are the data, file or no file."""
    path = _commit(spool, 1, b"0123456789")
    qf = QueueFile.open(path)
    content = QueueFileContent(path, qf.content_offset, qf.content_size, data=b"0123456789")
    path.unlink()
    assert [c async for c in content.chunks(4)] == [b"0123", b"4567", b"89"]
    assert content.read() == b"0123456789"


def test_a_file_that_grew_since_the_fstat_is_read_as_a_big_one(
    spool: Spool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The one pread asks for the stat size + 1: more bytes than the stat said are not
    parsed as the whole file; the buffered path reads it by its stat size."""
    path = _commit(spool, 2, b"x\r\n" * 100)
    want = load_queue_file(path, 10, 100_000)

    def grows(path: Path, flags: int, mode: int = 0o600) -> tuple[int, os.stat_result]:
        fd, st = open_regular_stat(path, flags, mode)
        with open(path, "ab") as f:
            f.write(b"junk")
        return fd, st

    monkeypatch.setattr(loadread, "open_regular_stat", grows)
    got = load_queue_file(path, 10, 100_000)
    assert (got.qf, got.recipients, got.next_offset) == (want.qf, want.recipients, 0)
    assert got.content is None and want.content == b"x\r\n" * 100


def _stream_parse(
    data: bytes, path: Path, limit: int
) -> tuple[QueueFile | str, list[RecipientRecord] | str, int]:
    """What the record stream gives for ``data``: the envelope, the first recipients and
    the resume offset (an error as its type and text)."""
    try:
        qf = QueueFile.parse(io.BytesIO(data), path, len(data))
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}", "", 0
    try:
        rcpts, nxt = recipients_from(
            io.BytesIO(data), len(data), path, qf.first_recipient_offset, limit
        )
    except Exception as exc:
        return qf, f"{type(exc).__name__}: {exc}", 0
    return qf, rcpts, nxt


def _whole_parse(
    data: bytes, path: Path, limit: int
) -> tuple[QueueFile | str, list[RecipientRecord] | str, int]:
    """The same through the load of a file read whole (``load_queue_file``)."""
    path.write_bytes(data)
    try:
        got = load_queue_file(path, limit, len(data))
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}", "", 0
    if isinstance(got.recipients, Exception):
        return got.qf, f"{type(got.recipients).__name__}: {got.recipients}", got.next_offset
    assert got.content == data[got.qf.content_offset : got.qf.content_offset
                               + got.qf.content_size]
    return got.qf, got.recipients, got.next_offset


_TEXT = st.text(st.characters(blacklist_categories=["Cs"]), max_size=150)
_NOTIFY = st.sampled_from(
    [frozenset(), frozenset({"NEVER"}), frozenset({"SUCCESS", "DELAY"}),
     frozenset({"FAILURE"}), frozenset({"SUCCESS", "FAILURE", "DELAY"})]
)


@st.composite
def _queue_files(draw: st.DrawFn) -> tuple[bytes, int]:
    rcpts = tuple(
        RecipientSpec(draw(_TEXT) or "r@x", draw(st.none() | _TEXT), draw(_NOTIFY))
        for _ in range(draw(st.integers(1, 4)))
    )
    env = Envelope(
        sender=draw(_TEXT),
        recipients=rcpts,
        arrival_time=draw(st.floats(0, 4e9)),
        envid=draw(st.none() | _TEXT),
        ret=draw(st.sampled_from([None, "FULL", "HDRS"])),
        smtputf8=draw(st.booleans()),
        body=draw(st.sampled_from([None, "7BIT", "8BITMIME"])),
        client_name=draw(st.none() | _TEXT),
        helo=draw(st.none() | _TEXT),
        warn_time=draw(st.none() | st.integers(-1, 2**40)),
        sasl_username=draw(st.none() | _TEXT),
    )
    content = draw(st.binary(max_size=300))
    head, tail = encode_queue_file(env, len(content))
    data = bytearray(head + content + tail)
    for _ in range(draw(st.integers(0, 3))):  # damage: bytes changed, dropped or added
        pos = draw(st.integers(0, len(data)))
        what = draw(st.sampled_from(["set", "drop", "add"]))
        if what == "set" and pos < len(data):
            data[pos] = draw(st.integers(0, 255))
        elif what == "drop":
            del data[pos : pos + draw(st.integers(1, 5))]
        else:
            data[pos:pos] = draw(st.binary(min_size=1, max_size=3))
    done = draw(st.lists(st.integers(0, 3), max_size=2))
    data_b = bytes(data)
    for index in done:  # done marks on intact files
        offsets = [i for i in range(len(data_b)) if data_b[i : i + 1] == b"R"]
        if index < len(offsets):
            data[offsets[index]] = ord("D")
    return bytes(data), draw(st.integers(1, 5))


@given(_queue_files())
@settings(
    max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
def test_the_whole_file_parse_is_the_record_stream(
    tmp_path: Path, case: tuple[bytes, int]
) -> None:
    """A file read whole loads exactly as the record stream reads it: the same envelope,
    recipients and resume offset, or the same error, intact or damaged."""
    data, limit = case
    path = tmp_path / "qf"
    assert _whole_parse(data, path, limit) == _stream_parse(data, path, limit)


def _base_files() -> list[bytes]:
    small = Envelope("s@x.test", (RecipientSpec("r@y.test"),), 1_000_000_000.25)
    full = Envelope(
        sender="s" * 140 + "@x.test",  # a two-byte length field
        recipients=(
            RecipientSpec("a@y.test", "rfc822;a@y.test", frozenset({"SUCCESS", "FAILURE"})),
            RecipientSpec("b@y.test", notify=frozenset({"NEVER"})),
            RecipientSpec("c@y.test"),
        ),
        arrival_time=1_700_000_000.5,
        envid="E1",
        ret="HDRS",
        smtputf8=True,
        body="8BITMIME",
        client_name="c.test",
        client_addr="127.0.0.1",
        helo="h",
        warn_time=1_700_003_600,
        sasl_username="u",
    )
    out = []
    for env, content in ((small, b"x\r\n"), (full, b"y" * 130)):
        head, tail = encode_queue_file(env, len(content))
        out.append(head + content + tail)
    # An empty recipient record, then a good one: refused by the stream, whatever follows.
    head, tail = encode_queue_file(small, 3)
    first = QueueFile.parse(io.BytesIO(head + b"x\r\n" + tail), Path("x"), len(head) + 5)
    at = first.first_recipient_offset
    out.append(_resized(head[:at] + b"R\x00" + head[at:], b"x\r\n", tail))
    # The null sender's empty record with a length field of 10 and 11 bytes (the stream
    # reads at most 10).
    null, tail = encode_queue_file(Envelope("", small.recipients, 1.5), 3)
    for extra in (9, 10):
        long_length = null.replace(b"S\x00", b"S" + b"\x80" * extra + b"\x00", 1)
        out.append(_resized(long_length, b"x\r\n", tail))
    return out


def _resized(head: bytes, content: bytes, tail: bytes) -> bytes:
    """``head + content + tail`` with the size record's content offset fixed up."""
    fields = head[2:65].split()
    fields[1] = b"%d" % len(head)
    return head[:2] + b"%15d %15d %15d %15d" % tuple(int(f) for f in fields) + head[65:] + (
        content + tail
    )


@pytest.mark.parametrize(
    "base", _base_files(), ids=["small", "full", "empty-rcpt", "len10", "len11"]
)
def test_every_single_damage_loads_as_the_record_stream_reads_it(
    tmp_path: Path, base: bytes
) -> None:
    """Every byte of a file set to each interesting value, dropped, doubled, or the file
    cut there: the whole-file parse gives what the record stream gives (or its error)."""
    path = tmp_path / "qf"
    values = sorted({0, 1, 0x7F, 0x80, 0x81, 0xFF, *b"CTSAWRDMEx =1-"})
    cases = [base, base.replace(b"R", b"D", 1)]
    for pos in range(len(base)):
        cases += [base[:pos] + bytes((v,)) + base[pos + 1 :] for v in values]
        cases += [base[:pos], base[:pos] + base[pos + 1 :], base[:pos] + base[pos:]]
        cases.append(base[: pos + 1] + base[pos:])
    for data in cases:
        for limit in (1, 2):
            assert _whole_parse(data, path, limit) == _stream_parse(data, path, limit), data
