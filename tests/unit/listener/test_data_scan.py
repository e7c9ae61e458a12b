"""DATA's end-of-data search and dot-unstuffing per chunk, and the reads that feed it.

``_scan`` looks for a "." with memchr before it looks for CRLF "."; these tests
hold it to the plain one-``find``-per-CRLF-"." scan it replaced, on streams
with long runs without a dot, dots inside lines and CRLF "." at every offset,
and check that a 100 KB message reaches the writer without a copy.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from qmgrd.listener import dotscan
from qmgrd.listener.channel import Channel
from qmgrd.listener.dotscan import scan_data as _scan
from qmgrd.listener.protocol import Command, Content, DataEnd, ServerProtocol
from tests.unit.listener.test_listener_protocol import _chunked, _drain


def _plain_scan(stream: bytes, skip: int) -> tuple[bytes, int, int]:
    """The reference: every CRLF "." found by one ``find`` of it, pieces joined."""
    pieces: list[bytes] = []
    start = skip
    pos = 0
    while True:
        i = stream.find(b"\r\n.", pos)
        if i < 0:
            break
        after = stream[i + 3 : i + 5]
        if after == b"\r\n":
            pieces.append(stream[start : i + 2])
            return b"".join(pieces), i + 2, i + 5
        if after in (b"", b"\r"):
            pieces.append(stream[start : i + 2])
            return b"".join(pieces), i + 2, -1
        pieces.append(stream[start : i + 2])
        start = pos = i + 3
    pieces.append(stream[start:])
    return b"".join(pieces), len(stream), -1


# Long dot-free runs (the memchr path), dots inside lines, line ends of every kind.
PIECES = st.sampled_from(
    [b"\r\n", b"\r", b"\n", b".", b"..", b"x", b"\r\n.\r\n", b"a.b", b"X" * 300, b"Y" * 5000]
)


@given(
    stream=st.lists(PIECES, max_size=40).map(b"".join),
    skip=st.integers(min_value=0, max_value=4),
)
@settings(max_examples=400, deadline=None)
def test_scan_agrees_with_the_plain_scan(stream: bytes, skip: int) -> None:
    """Same content, held-back offset and end for any stream and skip."""
    skip = min(skip, len(stream))
    content, held, end = _scan(stream, skip)
    assert (bytes(content), held, end) == _plain_scan(stream, skip)


@given(
    stream=st.lists(st.sampled_from([b"\r\n", b"\r", b"\n", b".", b"x", b"ab", b"\r\n.\r\n"]))
    .map(b"".join),
    skip=st.integers(min_value=0, max_value=2),
    span=st.integers(min_value=3, max_value=9),
    cost=st.integers(min_value=0, max_value=6),
)
@settings(max_examples=400, deadline=None)
def test_scan_agrees_across_memchr_steps_and_spans(
    stream: bytes, skip: int, span: int, cost: int
) -> None:
    """With tiny spans and credits the scan switches mode often: still the plain scan's answer."""
    skip = min(skip, len(stream))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(dotscan, "_SPAN", span)
        patch.setattr(dotscan, "_PROBE_COST", cost)
        patch.setattr(dotscan, "_CREDIT", 4)
        patch.setattr(dotscan, "_SHORT", 0)
        content, held, end = _scan(stream, skip)
    assert (bytes(content), held, end) == _plain_scan(stream, skip)


@pytest.mark.parametrize("at", range(0, 12))
def test_crlf_dot_at_every_offset_around_the_first_dot(at: int) -> None:
    """A CRLF "." right at the start, after a dot-free run, or after a dot within a line."""
    for lead in (b"", b"abc", b"a.c", b"."):
        for tail in (b"", b"\r", b"\r\n", b"x\r\n", b".\r\n"):
            stream = (lead + b"y" * at)[: max(at, len(lead))] + b"\r\n." + tail
            for skip in (0, 1, 2):
                content, held, end = _scan(stream, skip)
                assert (bytes(content), held, end) == _plain_scan(stream, skip), (stream, skip)


def test_the_last_chunk_is_a_view_and_the_middle_the_very_chunk() -> None:
    """A 100 KB message without stuffed dots: no byte of it is copied by the protocol."""
    proto = ServerProtocol()
    proto.start_data()
    first = b"Subject: x\r\n\r\n" + b"X" * 78 + b"\r\n" + (b"Y" * 78 + b"\r\n") * 800
    last = (b"Z" * 78 + b"\r\n") * 450 + b".\r\nQUIT\r\n"
    proto.receive_data(first)
    (event,) = _drain(proto)
    assert isinstance(event, Content) and event.data is first
    proto.receive_data(last)
    content, end, quit_ = _drain(proto)
    assert isinstance(content, Content) and isinstance(content.data, memoryview)
    assert content.data.obj is last and bytes(content.data) == last[: -len(b".\r\nQUIT\r\n")]
    assert end == DataEnd(len(first) + len(content.data))
    assert quit_ == Command("QUIT", "")


@given(
    lines=st.lists(st.sampled_from([b"", b".", b"..x", b"a.b", b"X" * 900, b"\r", b"q\n."])),
    cut=st.integers(min_value=1, max_value=20_000),
)
@settings(max_examples=200, deadline=None)
def test_big_chunks_read_as_the_whole_stream_would(lines: list[bytes], cut: int) -> None:
    """Stuffed content in chunks of up to 20 KB comes out unstuffed, ends at the marker."""
    content = b"".join(line + b"\r\n" for line in lines)
    stuffed = (b"\r\n" + content).replace(b"\r\n.", b"\r\n..")[2:]
    wire = stuffed + b".\r\nNOOP\r\n"
    got, rest = _chunked(ServerProtocol(), wire, [cut])
    assert got == content
    assert rest == [DataEnd(len(content)), Command("NOOP", "")]


async def test_big_chunks_are_read_alone_small_ones_joined() -> None:
    """Two DATA chunks waiting are read one by one, each the very object received."""
    chan = Channel(1 << 20)
    one, two = b"a" * 65536, b"b" * 36997
    chan.data_received(one)
    chan.data_received(two)
    assert await chan.read(262144, 1.0) is one
    assert await chan.read(262144, 1.0) is two
    chan.data_received(b"RSET\r\n")
    chan.data_received(b"NOOP\r\n")
    chan.data_received(b"c" * 5000)
    assert await chan.read(262144, 1.0) == b"RSET\r\nNOOP\r\n"  # small ones still joined
    assert len(await chan.read(262144, 1.0)) == 5000

