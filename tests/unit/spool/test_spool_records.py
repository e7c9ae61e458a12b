"""Queue-file records: write → read round trips, batching, done marks, damage detection."""

from __future__ import annotations

import os
from collections.abc import Callable

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from qmgrd.daemon.iobatch import IoBatcher
from qmgrd.errors import InvariantError, SpoolError
from qmgrd.spool import (
    WARNED,
    Envelope,
    QueueFile,
    QueueFileContent,
    RecipientSpec,
    Spool,
    mark_done,
    read_content,
    rewrite_warn_time,
)

_text = st.text(st.characters(exclude_categories=["Cs"]), max_size=40)
_notify: st.SearchStrategy[frozenset[str]] = st.one_of(
    st.just(frozenset[str]()),
    st.just(frozenset({"NEVER"})),
    st.frozensets(st.sampled_from(["SUCCESS", "FAILURE", "DELAY"]), min_size=1),
)
_rcpt = st.builds(RecipientSpec, _text, st.one_of(st.none(), _text), _notify)
_content = st.one_of(
    st.binary(max_size=3000),
    st.lists(st.sampled_from([b"\r\n", b"\n", b"\r", b"\x00", b".", b"x" * 1500, b"ab"]))
    .map(b"".join),
)
_envelope = st.builds(
    Envelope,
    sender=_text,
    recipients=st.lists(_rcpt, min_size=1, max_size=30).map(tuple),
    arrival_time=st.integers(0, 4_000_000_000_000_000).map(lambda us: us / 1e6),
    envid=st.one_of(st.none(), _text),
    ret=st.sampled_from([None, "FULL", "HDRS"]),
    smtputf8=st.booleans(),
    body=st.sampled_from([None, "7BIT", "8BITMIME"]),
    client_name=st.one_of(st.none(), _text),
    client_addr=st.one_of(st.none(), _text),
    helo=st.one_of(st.none(), _text),
    warn_time=st.one_of(st.none(), st.integers(-1, 10**12)),
    sasl_username=st.one_of(st.none(), _text),
)

_settings = settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


def _specs(qf: QueueFile) -> list[RecipientSpec]:
    return [RecipientSpec(r.address, r.orcpt, r.notify) for r in qf.read_all_recipients()]


@_settings
@given(env=_envelope, content=_content)
def test_round_trip(spool: Spool, env: Envelope, content: bytes) -> None:
    """Every envelope field, every recipient and the exact content bytes survive write → read."""
    queue_id = spool.commit(env, content)
    qf = spool.open("incoming", queue_id)
    assert qf.sender == env.sender
    assert round(qf.arrival_time * 1e6) == round(env.arrival_time * 1e6)
    assert (qf.envid, qf.ret, qf.smtputf8, qf.body) == (env.envid, env.ret, env.smtputf8, env.body)
    assert (qf.client_name, qf.client_addr, qf.helo) == (env.client_name, env.client_addr, env.helo)
    assert qf.warn_time == env.warn_time
    assert qf.sasl_username == env.sasl_username
    assert qf.rcpt_count == len(env.recipients)
    assert _specs(qf) == list(env.recipients)
    assert read_content(qf.path) == content
    assert qf.content_size == len(content)


@_settings
@given(
    n=st.integers(1, 60),
    limits=st.lists(st.integers(1, 70), min_size=1, max_size=80),
    done=st.sets(st.integers(0, 59)),
)
def test_batches_and_done_marks(
    spool: Spool, n: int, limits: list[int], done: set[int]
) -> None:
    """Batches of any size from saved offsets yield exactly the not-done recipients, in order."""
    env = Envelope("s@x", tuple(RecipientSpec(f"r{i}@x") for i in range(n)), 1.0)
    qf = spool.open("incoming", spool.commit(env, b"body\r\n"))
    everyone = qf.read_all_recipients()
    mark_done(qf.path, [everyone[i].offset for i in sorted(done) if i < n])
    qf = spool.open("incoming", qf.queue_id)  # a fresh reader, as after a restart
    expected = [f"r{i}@x" for i in range(n) if i not in done]
    got: list[str] = []
    offset = qf.first_recipient_offset
    steps = 0
    while offset:
        batch, offset = qf.read_recipients(offset, limits[steps % len(limits)])
        assert len(batch) <= limits[steps % len(limits)]
        got.extend(r.address for r in batch)
        steps += 1
        assert steps <= n + 2
    assert got == expected


def test_resume_offset_zero_when_only_done_remain(spool: Spool) -> None:
    """A batch that ends before trailing done records reports 0: nothing left to read."""
    env = Envelope("", tuple(RecipientSpec(f"r{i}@x") for i in range(3)), 1.0)
    qf = spool.open("incoming", spool.commit(env, b""))
    records = qf.read_all_recipients()
    mark_done(qf.path, [records[1].offset, records[2].offset])
    batch, offset = qf.read_recipients(qf.first_recipient_offset, 1)
    assert [r.address for r in batch] == ["r0@x"]
    assert offset == 0


def test_mark_done_rejects_offsets_that_are_not_recipients(spool: Spool) -> None:
    """A done mark at a non-recipient offset is a caller bug and changes nothing."""
    env = Envelope("s@x", (RecipientSpec("a@x"),), 1.0)
    qf = spool.open("incoming", spool.commit(env, b"x"))
    before = qf.path.read_bytes()
    with pytest.raises(InvariantError):
        mark_done(qf.path, [0])
    assert qf.path.read_bytes() == before


def test_mark_done_over_a_span_larger_than_one_read(spool: Spool) -> None:
    """Offsets spread over more than one read's span are all checked and marked; a bad one
    among them is still refused, and nothing but type bytes is ever written."""
    long = "x" * 400
    env = Envelope("s@x", tuple(RecipientSpec(f"r{i}.{long}@x") for i in range(400)), 1.0)
    qf = spool.open("incoming", spool.commit(env, b"body\r\n"))
    records = qf.read_all_recipients()
    assert records[-1].offset - records[0].offset > 65536
    marked = [r.offset for r in records[::3]]
    before = qf.path.read_bytes()
    mark_done(qf.path, reversed(marked))
    after = qf.path.read_bytes()
    changed = [i for i, (a, b) in enumerate(zip(before, after, strict=True)) if a != b]
    assert changed == marked
    qf = spool.open("incoming", qf.queue_id)
    left = [r.offset for r in qf.read_all_recipients()]  # the recipients not done
    assert left == [r.offset for r in records if r.offset not in marked]
    with pytest.raises(InvariantError):
        mark_done(qf.path, [records[1].offset, records[1].offset + 1])


def test_warn_time_rewritten_in_place(spool: Spool) -> None:
    """The W record can be rewritten (to WARNED) without touching anything else."""
    env = Envelope("s@x", (RecipientSpec("a@x"),), 1.0, warn_time=1234)
    qf = spool.open("incoming", spool.commit(env, b"hello"))
    assert qf.warn_offset is not None
    rewrite_warn_time(qf.path, qf.warn_offset, WARNED)
    again = spool.open("incoming", qf.queue_id)
    assert again.warn_time == WARNED
    assert read_content(again.path) == b"hello"


@pytest.mark.parametrize(
    ("damage", "reason"),
    [
        (lambda b: b[:-1], "does not match"),
        (lambda b: b + b"x", "does not match"),
        (lambda b: b"Z" + b[1:], "size record"),
        (lambda b: b[:-2] + b"Q\x00", "no end record"),
        (lambda b: b"", "truncated"),
    ],
)
def test_damaged_files_raise_spool_error(
    spool: Spool, damage: Callable[[bytes], bytes], reason: str
) -> None:
    """Truncated, extended or overwritten files raise SpoolError naming what is wrong."""
    env = Envelope("s@x", (RecipientSpec("a@x"),), 1.0)
    path = spool.path("incoming", spool.commit(env, b"content\r\n"))
    path.write_bytes(damage(path.read_bytes()))
    with pytest.raises(SpoolError, match=reason):
        QueueFile.open(path)


async def test_content_streams_in_chunks(spool: Spool) -> None:
    """The async content source yields the exact bytes in chunks of the requested size."""
    content = bytes(range(256)) * 1000
    env = Envelope("s@x", (RecipientSpec("a@x"),), 1.0)
    source = QueueFileContent.of(spool.open("incoming", spool.commit(env, content)))
    chunks = [c async for c in source.chunks(10_000)]
    assert source.size == len(content)
    assert b"".join(chunks) == content
    assert max(len(c) for c in chunks) == 10_000


async def test_content_first_read_goes_through_the_given_runner(spool: Spool) -> None:
    """With ``run`` (the daemon's IoBatcher.submit) the open and first chunk take that hop;
    the later chunks and the bytes are unchanged."""
    content = bytes(range(256)) * 100
    env = Envelope("s@x", (RecipientSpec("a@x"),), 1.0)
    qf = spool.open("incoming", spool.commit(env, content))
    batcher = IoBatcher()
    source = QueueFileContent(qf.path, qf.content_offset, qf.content_size, run=batcher.submit)
    fds = len(os.listdir("/proc/self/fd"))
    chunks = [c async for c in source.chunks(10_000)]
    assert b"".join(chunks) == content
    assert (batcher.hops, batcher.jobs) == (1, 1)
    whole = [c async for c in source.chunks()]  # one chunk: closed in the worker already
    assert whole == [content]
    assert len(os.listdir("/proc/self/fd")) == fds  # no descriptor left open either way


def test_envelope_validation() -> None:
    """Envelopes without recipients or with bad DSN values are refused at construction."""
    with pytest.raises(InvariantError):
        Envelope("s@x", (), 1.0)
    with pytest.raises(InvariantError):
        Envelope("s@x", (RecipientSpec("a@x"),), 1.0, ret="ALL")
    with pytest.raises(InvariantError):
        RecipientSpec("a@x", notify=frozenset({"NEVER", "DELAY"}))


def test_file_without_sasl_username_reads_as_unauthenticated(spool: Spool) -> None:
    """A queue file written before the sasl_username record existed has no such attribute:
    it reads with ``sasl_username`` None, and an authenticated one keeps its identity."""
    rcpt = (RecipientSpec("r@x.test"),)
    old = spool.commit(Envelope("s@x.test", rcpt, 1.0, client_addr="192.0.2.1"), b"x")
    raw = spool.path("incoming", old).read_bytes()
    assert b"sasl_username" not in raw
    assert spool.open("incoming", old).sasl_username is None
    new = spool.commit(Envelope("s@x.test", rcpt, 1.0, sasl_username="alice"), b"x")
    assert spool.open("incoming", new).sasl_username == "alice"
