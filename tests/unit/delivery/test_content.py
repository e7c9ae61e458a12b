"""DATA transparency encoding across chunk boundaries, and the in-memory content source."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass

import pytest
from aiosmtplib.protocol import normalize_message_line_endings
from hypothesis import given
from hypothesis import strategies as st

from qmgrd.delivery.agent import ContentSource, DeliveryRequest, Recipient
from qmgrd.delivery.client import Reply
from qmgrd.delivery.content import (
    _LINE_ENDINGS,
    DOT_WALK,
    BytesContent,
    DataEncoder,
    _crlf_only,
    _normalized_if_simple,
    encode_data,
)
from qmgrd.delivery.mx import Endpoint
from qmgrd.delivery.session import Session
from qmgrd.delivery.settings import SmtpSettings
from qmgrd.delivery.transaction import CONTENT_CHUNK, Transaction

_PERIOD = re.compile(rb"(?m)^\.")


def _reference(message: bytes) -> bytes:
    """aiosmtplib's whole-message encoding (normalize, dot-stuff, terminate).

    The one difference is deliberate: an empty message is a lone terminator
    here, where aiosmtplib sends an empty line first.
    """
    if not message:
        return b".\r\n"
    return _PERIOD.sub(b"..", normalize_message_line_endings(message)) + b".\r\n"


def _chunked(message: bytes, cuts: list[int]) -> bytes:
    enc = DataEncoder()
    out = []
    prev = 0
    for cut in sorted(c % (len(message) + 1) for c in cuts):
        out.append(enc.feed(message[prev:cut]))
        prev = max(prev, cut)
    out.append(enc.feed(message[prev:]))
    out.append(enc.finish())
    return b"".join(out)


def test_dot_stuffing_and_crlf_whole_message() -> None:
    """Leading dots are doubled, bare LF and CR become CRLF and a final CRLF is added."""
    assert encode_data(b".a\n..b\r\nc\rd") == b"..a\r\n...b\r\nc\r\nd\r\n.\r\n"


def test_empty_message_is_just_the_terminator() -> None:
    """An empty message is sent as a lone terminator line."""
    assert encode_data(b"") == b".\r\n"


def test_dot_after_chunk_boundary_is_stuffed() -> None:
    """A dot starting a line is stuffed even when the line break ended the previous chunk."""
    enc = DataEncoder()
    assert enc.feed(b"a\r") + enc.feed(b"\n.b") + enc.finish() == b"a\r\n..b\r\n.\r\n"


@pytest.mark.parametrize(
    ("chunk", "wire"),
    [
        (b"a\r\n.b\r\n", b"a\r\n..b\r\n"),  # CRLF only: passed through, dots stuffed
        (b"a\n\rb", b"a\r\n\r\nb"),  # as many CRs as LFs, yet no CRLF
        (b"a\r\nb\n\rc\r\n", b"a\r\nb\r\n\r\nc\r\n"),  # one pair out of order
        (b"a\rb\nc", b"a\r\nb\r\nc"),  # a lone CR and a lone LF
        (b"no line end", b"no line end"),
        (b"a\nb\n", b"a\r\nb\r\n"),  # LF only: the no-CR normalization (one replace)
        (b"\n\n.x\n", b"\r\n\r\n..x\r\n"),  # ... then dot-stuffed like any other
        (b"a\r\nb\nc", b"a\r\nb\r\nc"),  # CRs and a bare LF: the regex
        (b"a\rb\r\n", b"a\r\nb\r\n"),  # a lone CR among CRLFs: the regex
    ],
)
def test_line_ends_are_checked_before_the_crlf_fast_path(chunk: bytes, wire: bytes) -> None:
    """A chunk is passed over unchanged only when every CR and every LF is part of a CRLF."""
    assert DataEncoder().feed(chunk) == wire


@given(
    st.binary(max_size=200).map(lambda b: b.replace(b"x", b".").replace(b"y", b"\r")),
    st.lists(st.integers(min_value=0, max_value=400), max_size=8),
)
def test_chunked_encoding_equals_whole_message_encoding(message: bytes, cuts: list[int]) -> None:
    """Encoding in arbitrary chunks gives exactly aiosmtplib's whole-message encoding."""
    assert _chunked(message, cuts) == _reference(message)


def _counted_crlf_only(data: bytes) -> bool:
    """The encoder's former test: as many CRs as LFs, and as many CRLFs as either."""
    lf = data.count(b"\n")
    return lf == data.count(b"\r") and (not lf or lf == data.count(b"\r\n"))


@given(st.lists(st.sampled_from([b"\r", b"\n", b"\r\n", b"a", b"\x0b", b"\x0c", b"\x1c", b"\x85"])))
def test_crlf_only_agrees_with_counting(parts: list[bytes]) -> None:
    """The replace check says "CRLF only" exactly when the counts do (CR, LF, and the
    breaks str.splitlines knows but bytes.splitlines does not, which are no line ends)."""
    data = b"".join(parts)
    assert _crlf_only(data) == _counted_crlf_only(data)


@given(st.lists(st.sampled_from([b"\r", b"\n", b"\r\n", b"a", b"."])))
def test_simple_normalization_equals_the_regex(parts: list[bytes]) -> None:
    """The replace-based fast paths give the regex's bytes or decline (None), never others:
    the chunk itself exactly when it is CRLF only, the LF-only normalization when it has no CR."""
    data = b"".join(parts)
    normal = _normalized_if_simple(data)
    if normal is not None:
        assert normal == _LINE_ENDINGS.sub(b"\r\n", data)
    assert (normal is data) == _counted_crlf_only(data)
    assert (normal is None) == (b"\r" in data and not _counted_crlf_only(data))


_LINES = st.lists(
    st.text(alphabet="a.X", max_size=12).map(str.encode),
    max_size=60,
)


@given(
    _LINES,
    st.lists(st.sampled_from([b"\r\n", b"\n", b"\r", b"\n\r"]), min_size=1, max_size=60),
    st.lists(st.integers(min_value=0, max_value=2000), max_size=6),
)
def test_chunked_encoding_of_dotty_lines(
    lines: list[bytes], ends: list[bytes], cuts: list[int]
) -> None:
    """Lines full of dots (more than DOT_WALK per chunk, at line starts and inside lines),
    mostly CRLF: any chunking gives exactly the whole-message reference encoding."""
    message = b"".join(line + ends[i % len(ends)] for i, line in enumerate(lines))
    assert _chunked(message, cuts) == _reference(message)


@pytest.mark.parametrize("before", [0, DOT_WALK - 1, DOT_WALK, DOT_WALK + 1, 3 * DOT_WALK])
def test_a_line_start_dot_after_many_inner_dots_is_stuffed(before: int) -> None:
    """The dot walk gives up after DOT_WALK dots: a line-start dot after more is still stuffed."""
    head = b"a.b " * before
    assert DataEncoder().feed(head + b"\r\n.x\r\n") == head + b"\r\n..x\r\n"


@pytest.mark.parametrize("dots", [0, 1, DOT_WALK, DOT_WALK + 1, 200])
def test_dots_inside_lines_are_left_alone(dots: int) -> None:
    """Dots that start no line (none after an LF) go out as they came."""
    chunk = b"x" + b"a.b\r\nc" * dots + b"\r\n"
    assert DataEncoder().feed(chunk) == chunk


async def test_bytes_content_chunks() -> None:
    """BytesContent yields its bytes in order in chunks of the requested size."""
    content = BytesContent(b"abcdefg")
    assert content.size == 7
    assert [c async for c in content.chunks(3)] == [b"abc", b"def", b"g"]


class _Connection:
    """Records what the transaction writes; answers the final reply with 250."""

    def __init__(self) -> None:
        self.writes: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.writes.append(data)

    def writelines(self, parts: Iterable[bytes]) -> None:
        self.writes.append(b"".join(parts))  # one call: one write

    async def drain(self, timeout: float) -> None:
        return None

    async def read_reply(self, timeout: float) -> Reply:
        return Reply(250, "2.0.0 Ok")


def _session(protocol: _Connection) -> Session:
    return Session(protocol, Endpoint("mx", "127.0.0.1", 25), "mx", False, 0.0)  # type: ignore[arg-type]


async def _send(protocol: _Connection, content: ContentSource) -> Reply:
    """The transaction's content phase for ``content`` over ``protocol``."""
    request = DeliveryRequest(
        queue_id="Q1",
        transport="smtp",
        nexthop="mx",
        sender="s@x",
        recipients=(Recipient("r@x", offset=0),),
        content=content,
    )
    return await Transaction(SmtpSettings())._send_content(_session(protocol), request)


@pytest.mark.parametrize("chunks", [1, 3])
async def test_last_chunk_goes_out_with_the_end_of_data(chunks: int) -> None:
    """The body's last chunk and ``.CRLF`` share one write; the bytes are the whole encoding."""
    content = b"Subject: x\r\n\r\n" + b".dot\r\n" * 30_000
    size = len(content) // chunks + 1
    protocol = _Connection()
    reply = await _send(protocol, _Chunked(content, size))
    assert reply.code == 250
    assert len(protocol.writes) == chunks
    assert protocol.writes[-1].endswith(b"\r\n.\r\n")
    assert b"".join(protocol.writes) == encode_data(content)


@dataclass(frozen=True, slots=True)
class _Chunked:
    """Content served in chunks of ``size`` whatever the caller asks (never as ``data``)."""

    raw: bytes
    step: int

    @property
    def size(self) -> int:
        return len(self.raw)

    @property
    def data(self) -> None:
        return None

    async def chunks(self, chunk_size: int = 65536) -> AsyncIterator[bytes]:
        for start in range(0, len(self.raw), self.step):
            yield self.raw[start : start + self.step]


@dataclass(slots=True)
class _Recording:
    """Content that records the chunk size each read asked for (never handed as ``data``)."""

    raw: bytes
    asked: list[int]

    @property
    def size(self) -> int:
        return len(self.raw)

    @property
    def data(self) -> None:
        return None

    async def chunks(self, chunk_size: int = 65536) -> AsyncIterator[bytes]:
        self.asked.append(chunk_size)
        for start in range(0, len(self.raw), chunk_size):
            yield self.raw[start : start + chunk_size]


async def test_a_100_kb_message_is_one_read_and_one_write() -> None:
    """The transaction reads the content in big chunks: 100 KB is one read and one write."""
    content = _Recording(b"Subject: x\r\n\r\n" + (b"x" * 78 + b"\r\n") * 1280, [])
    protocol = _Connection()
    reply = await _send(protocol, content)
    assert reply.code == 250
    assert content.asked == [CONTENT_CHUNK] and CONTENT_CHUNK >= 100 * 1024
    assert len(protocol.writes) == 1
    assert protocol.writes[0] == encode_data(content.raw)


@dataclass(slots=True)
class _InMemory:
    """Content held in memory (``data``), recording whether ``chunks`` was read."""

    raw: bytes
    asked: list[int]

    @property
    def size(self) -> int:
        return len(self.raw)

    @property
    def data(self) -> bytes:
        return self.raw

    async def chunks(self, chunk_size: int = 65536) -> AsyncIterator[bytes]:
        self.asked.append(chunk_size)
        for start in range(0, len(self.raw), chunk_size):
            yield self.raw[start : start + chunk_size]


@pytest.mark.parametrize(
    ("raw", "streamed"),
    [
        (b"", False),
        (b"Subject: x\r\n\r\n.dot\nlone cr\r" + b"x" * 900, False),
        (b"Subject: x\r\n\r\n" + b".dot\r\n" * 60_000, True),  # over CONTENT_CHUNK
    ],
)
async def test_content_in_memory_is_sent_as_streamed(raw: bytes, streamed: bool) -> None:
    """Content held as ``data`` up to one chunk is sent from memory, byte for byte as streamed."""
    in_memory, chunked = _InMemory(raw, []), _Recording(raw, [])
    memory_writes, stream_writes = _Connection(), _Connection()
    await _send(memory_writes, in_memory)
    await _send(stream_writes, chunked)
    assert memory_writes.writes == stream_writes.writes
    assert b"".join(memory_writes.writes) == encode_data(raw)
    assert in_memory.asked == ([CONTENT_CHUNK] if streamed else [])
