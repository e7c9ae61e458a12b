"""The streaming queue-file writer: same files as a one-shot write, bounded buffer, no leftovers."""

from __future__ import annotations

import os

import pytest

from qmgrd.errors import InvariantError, SpoolError
from qmgrd.spool import Envelope, QueueFile, RecipientSpec, Spool, read_content
from qmgrd.spool.commit import commit_writers
from qmgrd.spool.records import encode_queue_file
from qmgrd.spool.recycle import Recycler
from qmgrd.spool.writer import FLUSH_SIZE, EnvelopeHead, QueueFileWriter

HEAD = EnvelopeHead(
    sender="s\u00e9@x.test",
    arrival_time=1_000_000_000.25,
    envid="e+2B1",
    ret="HDRS",
    smtputf8=True,
    body="8BITMIME",
    client_name="unknown",
    client_addr="127.0.0.1",
    helo="c.test",
    warn_time=1_000_003_600,
    sasl_username="alice",
)
RCPTS = (
    RecipientSpec("a@y.test", "rfc822;A@y.test", frozenset({"SUCCESS", "DELAY"})),
    RecipientSpec('"sp ace"@y.test'),
    RecipientSpec("postmaster", None, frozenset({"NEVER"})),
)


def _write(
    spool: Spool,
    content: bytes,
    *,
    flush_size: int,
    piece: int = 1000,
    recycler: Recycler | None = None,
) -> str:
    writer = QueueFileWriter(spool, HEAD, flush_size=flush_size, recycler=recycler)
    for rcpt in RCPTS:
        writer.add_recipient(rcpt)
        if writer.needs_flush:
            writer.flush()
    writer.begin_content()
    for i in range(0, len(content), piece):
        writer.add_content(content[i : i + piece])
        if writer.needs_flush:
            writer.flush()
        assert writer.buffered < flush_size + piece
    (result,) = commit_writers(spool, [writer])
    assert isinstance(result, str)
    return result


def _envelope() -> Envelope:
    return Envelope(
        HEAD.sender,
        RCPTS,
        HEAD.arrival_time,
        HEAD.envid,
        HEAD.ret,
        HEAD.smtputf8,
        HEAD.body,
        HEAD.client_name,
        HEAD.client_addr,
        HEAD.helo,
        HEAD.warn_time,
        sasl_username=HEAD.sasl_username,
    )


@pytest.mark.parametrize("size", [0, 1, 127, 128, 5000])
def test_unflushed_message_is_byte_identical_to_a_one_shot_write(spool: Spool, size: int) -> None:
    """A message that fits the buffer is written once, exactly as encode_queue_file writes it."""
    content = bytes(range(256)) * (size // 256) + b"z" * (size % 256)
    qid = _write(spool, content, flush_size=1 << 20)
    head, tail = encode_queue_file(_envelope(), len(content))
    assert spool.path("incoming", qid).read_bytes() == head + content + tail


@pytest.mark.parametrize("size", [0, 127, 128, 16_383, 16_384, 300_000, 2_097_152])
@pytest.mark.parametrize("flush_size", [64, 4096, 65536])
def test_streamed_message_reads_back_with_every_marker_width(
    spool: Spool, size: int, flush_size: int
) -> None:
    """Flushed while written (padding before the content marker): envelope, recipients, content."""
    content = (b"line of text\r\n" * (size // 14 + 1))[:size]
    qid = _write(spool, content, flush_size=flush_size, piece=7000)
    qf = QueueFile.open(spool.path("incoming", qid))
    assert (qf.sender, qf.arrival_time, qf.rcpt_count, qf.content_size) == (
        HEAD.sender,
        HEAD.arrival_time,
        3,
        size,
    )
    assert (qf.envid, qf.ret, qf.smtputf8, qf.body, qf.helo, qf.warn_time) == (
        "e+2B1",
        "HDRS",
        True,
        "8BITMIME",
        "c.test",
        HEAD.warn_time,
    )
    got = [RecipientSpec(r.address, r.orcpt, r.notify) for r in qf.read_all_recipients()]
    assert got == list(RCPTS)
    assert read_content(qf.path) == content
    assert [n for n in os.listdir(spool.root / "incoming") if n.startswith(".")] == []


def test_many_recipients_are_flushed_as_they_come(spool: Spool) -> None:
    """20,000 recipients with a 4 KiB buffer: the buffer stays small, all of them read back."""
    writer = QueueFileWriter(spool, HEAD, flush_size=4096)
    for i in range(20_000):
        writer.add_recipient(RecipientSpec(f"user{i}@d{i % 7}.test"))
        if writer.needs_flush:
            writer.flush()
        assert writer.buffered < 4096 + 100
    writer.begin_content()
    writer.add_content(b"hi\r\n")
    (qid,) = commit_writers(spool, [writer])
    assert isinstance(qid, str)
    qf = QueueFile.open(spool.path("incoming", qid))
    addresses = [r.address for r in qf.read_all_recipients()]
    assert addresses == [f"user{i}@d{i % 7}.test" for i in range(20_000)]
    assert qf.rcpt_count == 20_000


def test_discard_leaves_nothing_and_is_idempotent(spool: Spool) -> None:
    """A discarded writer (flushed or not) removes its temporary file; twice is harmless."""
    writer = QueueFileWriter(spool, HEAD, flush_size=16)
    writer.add_recipient(RCPTS[0])
    writer.flush()
    assert len(os.listdir(spool.root / "incoming")) == 1
    writer.discard()
    writer.discard()
    assert os.listdir(spool.root / "incoming") == []
    with pytest.raises(InvariantError):
        writer.flush()


def test_a_write_failure_is_a_spool_error_and_leaves_nothing(spool: Spool) -> None:
    """With incoming/ gone, flush and commit raise SpoolError and no file remains anywhere."""
    (spool.root / "incoming").rmdir()
    writer = QueueFileWriter(spool, HEAD)
    writer.add_recipient(RCPTS[0])
    writer.begin_content()
    writer.add_content(b"x")
    (result,) = commit_writers(spool, [writer])
    assert isinstance(result, SpoolError)
    writer2 = QueueFileWriter(spool, HEAD, flush_size=1)
    writer2.add_recipient(RCPTS[0])
    with pytest.raises(SpoolError):
        writer2.flush()
    (spool.root / "incoming").mkdir()
    assert os.listdir(spool.root / "incoming") == []


def test_misuse_is_a_bug(spool: Spool) -> None:
    """Content before a recipient, a recipient after content, commit without content: bugs."""
    writer = QueueFileWriter(spool, HEAD)
    with pytest.raises(InvariantError):
        writer.begin_content()
    with pytest.raises(InvariantError):
        writer.add_content(b"x")
    writer.add_recipient(RCPTS[0])
    with pytest.raises(InvariantError):
        writer.commit()
    writer.begin_content()
    with pytest.raises(InvariantError):
        writer.add_recipient(RCPTS[1])
    with pytest.raises(InvariantError):
        EnvelopeHead("s@x", 1.0, ret="SOME")


def test_the_head_is_immutable_and_checks_ret_and_body() -> None:
    """EnvelopeHead (a named tuple for speed) refuses assignment and bad RET/BODY values."""
    with pytest.raises(AttributeError):
        HEAD.sender = "other@x.test"  # type: ignore[misc]
    with pytest.raises(InvariantError):
        EnvelopeHead("s@x", 1.0, body="BINARYMIME")
    plain = EnvelopeHead("", 1.5)
    assert plain.encode() == b"T\x081 500000S\x00"
    assert repr(plain).startswith("EnvelopeHead(sender='', arrival_time=1.5, envid=None")


def test_queue_id_is_known_at_creation_and_kept_by_commit(spool: Spool) -> None:
    """The id drawn at MAIL time (named in Received:) is the committed file's id."""
    writer = QueueFileWriter(spool, HEAD, flush_size=64)
    early = writer.queue_id
    writer.add_recipient(RCPTS[0])
    writer.begin_content()
    writer.add_content(f"Received: id {early}\r\n\r\n".encode() + b"x" * 500)
    writer.flush()
    (qid,) = commit_writers(spool, [writer])
    assert qid == early
    assert f"id {early}".encode() in read_content(spool.path("incoming", qid))


def test_replace_recipients_before_any_flush(spool: Spool) -> None:
    """REDIRECT of a buffered message: the recipients are replaced in the buffer."""
    writer = QueueFileWriter(spool, HEAD)
    for rcpt in RCPTS:
        writer.add_recipient(rcpt)
    writer.begin_content()
    writer.add_content(b"Subject: s\r\n\r\nbody\r\n")
    writer.replace_recipients([RecipientSpec("abuse@z.test")])
    (qid,) = commit_writers(spool, [writer])
    assert isinstance(qid, str)
    qf = QueueFile.open(spool.path("incoming", qid))
    assert [r.address for r in qf.read_all_recipients()] == ["abuse@z.test"]
    assert qf.rcpt_count == 1
    assert read_content(spool.path("incoming", qid)) == b"Subject: s\r\n\r\nbody\r\n"


@pytest.mark.parametrize("size", [200 * 1024, 3 * 1024 * 1024 + 17])
def test_replace_recipients_after_flushes_rebuilds_the_file(spool: Spool, size: int) -> None:
    """REDIRECT of a message larger than the buffer: same content, only the new recipients."""
    content = bytes(range(256)) * (size // 256) + b"tail"
    writer = QueueFileWriter(spool, HEAD)  # the daemon's 128 KiB buffer
    for rcpt in RCPTS:
        writer.add_recipient(rcpt)
    writer.begin_content()
    for i in range(0, len(content), 65536):
        writer.add_content(content[i : i + 65536])
        if writer.needs_flush:
            writer.flush()
        assert writer.buffered < FLUSH_SIZE + 65536
    assert os.listdir(spool.root / "incoming") == ["." + writer.queue_id]  # flushed to disk
    writer.replace_recipients([RecipientSpec("abuse@z.test"), RecipientSpec("copy@z.test")])
    (qid,) = commit_writers(spool, [writer])
    assert isinstance(qid, str)
    path = spool.path("incoming", qid)
    qf = QueueFile.open(path)
    assert [r.address for r in qf.read_all_recipients()] == ["abuse@z.test", "copy@z.test"]
    assert qf.rcpt_count == 2 and qf.sender == HEAD.sender and qf.content_size == len(content)
    assert read_content(path) == content
    assert sorted(os.listdir(spool.root / "incoming")) == [qid]  # no temporary left


def test_failed_rebuild_leaves_nothing(spool: Spool, monkeypatch: pytest.MonkeyPatch) -> None:
    """A disk error while rebuilding for REDIRECT: SpoolError, and no file anywhere."""
    writer = QueueFileWriter(spool, HEAD, flush_size=1024)
    writer.add_recipient(RCPTS[0])
    writer.begin_content()
    writer.add_content(b"x" * 5000)
    writer.flush()
    writer.replace_recipients([RecipientSpec("abuse@z.test")])

    def broken(*args: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("qmgrd.spool.writer._copy", broken)
    (result,) = commit_writers(spool, [writer])
    assert isinstance(result, SpoolError)
    assert os.listdir(spool.root / "incoming") == []


def test_hold_target_commits_straight_into_hold(
    spool: Spool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """target = "hold": the file is linked into hold/ and never appears in incoming/."""
    seen: list[list[str]] = []
    real_link = os.link

    def link(src: object, dst: object) -> None:
        seen.append(sorted(os.listdir(spool.root / "incoming")))
        real_link(src, dst)  # type: ignore[arg-type]

    writer = QueueFileWriter(spool, HEAD)
    writer.add_recipient(RCPTS[0])
    writer.begin_content()
    writer.add_content(b"Subject: held\r\n\r\nx\r\n")
    writer.target = "hold"
    monkeypatch.setattr(os, "link", link)
    (qid,) = commit_writers(spool, [writer])
    monkeypatch.undo()
    assert isinstance(qid, str)
    assert seen == [["." + qid]]  # only the temporary, under a name every scan ignores
    assert spool.list_ids("hold") == [qid] and spool.list_ids("incoming") == []
    assert read_content(spool.path("hold", qid)) == b"Subject: held\r\n\r\nx\r\n"


def test_spool_commit_into_hold(spool: Spool) -> None:
    """Spool.commit(queue="hold"): durable in hold/, nothing in incoming/."""
    qid = spool.commit(_envelope(), b"a\r\n", queue="hold")
    assert spool.list_ids("hold") == [qid]
    assert os.listdir(spool.root / "incoming") == []


def test_commit_under_a_given_queue_id(spool: Spool) -> None:
    """Spool.commit(queue_id=...) stores under that id and refuses one already taken."""
    qid = spool.new_queue_id()
    assert spool.commit(_envelope(), b"a\r\n", queue_id=qid) == qid
    with pytest.raises(SpoolError):
        spool.commit(_envelope(), b"b\r\n", queue_id=qid)
    assert read_content(spool.path("incoming", qid)) == b"a\r\n"


@pytest.mark.parametrize("flush_size", [1 << 20, 65536])
def test_content_pieces_of_any_size_make_the_same_file(spool: Spool, flush_size: int) -> None:
    """Big pieces kept as given (one writev), small ones copied, runs of them joined: same file."""
    sizes = [1, 5000, 3, 70000, 4095, 4096, 9000] + [7] * 200 + [100_000] + [1] * 70
    content = bytes(i % 251 for i in range(sum(sizes)))
    writer = QueueFileWriter(spool, HEAD, flush_size=flush_size)
    for rcpt in RCPTS:
        writer.add_recipient(rcpt)
    writer.begin_content()
    pos = 0
    for size in sizes:
        writer.add_content(content[pos : pos + size])
        pos += size
        if writer.needs_flush:
            writer.flush()
        assert writer.buffered < flush_size + 100_000
    (qid,) = commit_writers(spool, [writer])
    assert isinstance(qid, str)
    if flush_size > len(content):  # never flushed: exactly the one-shot file
        head, tail = encode_queue_file(_envelope(), len(content))
        assert spool.path("incoming", qid).read_bytes() == head + content + tail
    assert read_content(spool.path("incoming", qid)) == content
