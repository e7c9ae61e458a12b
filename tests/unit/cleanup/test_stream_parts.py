"""``HeaderStream.feed_parts``: the header section's bytes and the body's, never joined or copied.

The listener writes the two parts one after the other; written so, they must be
exactly what ``feed`` gives for the same chunks, whether a chunk is ``bytes`` or
a view (the last chunk of a message, before the end marker).
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from qmgrd.cleanup import HeaderProcessor
from tests.unit.cleanup.test_processor import CHECKS, info, make_settings

LINES = st.sampled_from(
    [
        b"Subject: x",
        b"From: root",
        b"To: a, <b>",
        b"\tcontinued",
        b"",
        b"not a header",
        b"Received: " + b"r" * 300,
        b"X" * 20_000,
        b"body.line",
        b"N" * 1500 + b": long name",
        b"Subject: " + b"s" * 17_000,
    ]
)


def _processor(local: bool = True) -> HeaderProcessor:
    return HeaderProcessor(make_settings(CHECKS, header_size_limit=1024), info(local=local))


@given(
    lines=st.lists(LINES, max_size=30),
    cuts=st.lists(st.integers(min_value=1, max_value=40_000), min_size=1, max_size=8),
    views=st.lists(st.booleans(), min_size=1, max_size=8),
    eol=st.sampled_from([b"\r\n", b"\n"]),
)
@settings(max_examples=300, deadline=None)
def test_parts_written_in_turn_are_what_feed_gives(
    lines: list[bytes], cuts: list[int], views: list[bool], eol: bytes
) -> None:
    """Any message, any chunking, chunks as bytes or views: the same bytes as ``feed``."""
    message = eol.join(lines) + eol
    joined, parted = _processor(), _processor()
    want = bytearray()
    got = bytearray()
    at = 0
    for i in range(len(message)):  # bounded: every round takes at least one byte
        if at >= len(message):
            break
        chunk = message[at : at + cuts[i % len(cuts)]]
        at += len(chunk)
        want += joined.feed(chunk)
        head, body = parted.feed_parts(memoryview(chunk) if views[i % len(views)] else chunk)
        got += head
        got += body
    want += joined.finish()
    got += parted.finish()
    assert bytes(got) == bytes(want)
    assert parted.outcome == joined.outcome


def test_the_body_of_a_view_is_a_view_of_it() -> None:
    """A whole 100 KB message in one view: headers processed, the body not copied."""
    body = b"Y" * 78 + b"\r\n"
    message = b"Subject: hi\r\nTo: <a@b.example>\r\n\r\n" + body * 1300
    view = memoryview(message)
    p = _processor(local=False)  # no headers added after To:
    head, rest = p.feed_parts(view)
    assert head.startswith(b"Received: ") and head.endswith(b"To: <a@b.example>\r\n\r\n")
    assert isinstance(rest, memoryview) and rest.obj is message
    assert bytes(rest) == body * 1300
    assert not p.in_headers


def test_a_header_section_longer_than_a_window_in_a_view() -> None:
    """Headers spread over several read windows of a view still come out whole."""
    headers = b"".join(b"X-H%d: %s\r\n" % (n, b"v" * 200) for n in range(200))
    message = headers + b"\r\nbody\r\n"
    p = _processor(local=False)
    head, rest = p.feed_parts(memoryview(message))
    assert head.endswith(headers + b"\r\n")
    assert bytes(rest) == b"body\r\n"
    assert isinstance(rest, memoryview) and rest.obj is message


def test_body_chunks_after_the_headers_come_back_as_given() -> None:
    """In the body both kinds of chunk are returned as they are, with no header bytes."""
    p = _processor()
    assert p.feed_parts(b"Subject: x\r\n\r\n")[1] == b""
    chunk = b"z" * 70_000
    view = memoryview(chunk)[5:]
    assert p.feed_parts(chunk) == (b"", chunk) and p.feed_parts(chunk)[1] is chunk
    assert p.feed_parts(view)[1] is view


def test_a_line_longer_than_the_limit_is_judged_by_its_start_wherever_it_is_cut() -> None:
    """A line past header_size_limit is classified on its first ``limit`` bytes in any chunking.

    Its name's colon lies beyond the limit: it is no header (it ends the header
    section) whether it comes whole, cut anywhere, or in a view's windows.
    """
    line = b"N" * 1500 + b": value\r\n"
    message = b"Subject: x\r\n" + line + b"body\r\n"
    whole = _processor(local=False)
    want = whole.feed(message) + whole.finish()
    assert line in want  # passed on as a body line, not truncated as a header
    for cut in (13, 12 + 500, 12 + 1023, 12 + 1024, 12 + 1400):
        p = _processor(local=False)
        got = p.feed(message[:cut]) + p.feed(message[cut:]) + p.finish()
        assert got == want, cut
