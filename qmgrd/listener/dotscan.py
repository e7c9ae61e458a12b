"""DATA's end-of-data search and dot-unstuffing over one chunk (sans-IO, no state).

``scan_data(stream, skip)`` is the inner loop of ``ServerProtocol``'s DATA
mode (``qmgrd.listener.protocol``): it finds every CRLF "." in the bytes
received, says where the end marker is, what must be held back for the next
chunk, and returns the content without copying it when it is one run of the
chunk. It is a pure function of its arguments; the constants below only
choose between two ways of searching that give the same answer (the tests
hold it to the plain one-``find``-per-CRLF-"." scan).
"""

from __future__ import annotations

# The search: a "." found by memchr costs a Python step; where dots are dense
# (text), a span is searched for CRLF "." by one find instead.
_CREDIT = 8192  # bytes: the scan starts with memchr steps
_PROBE_COST = 512  # bytes of find's search that a memchr step costs (a dot farther away gains)
_SPAN = 16384  # bytes searched for CRLF "." by one find where dots are dense
_SHORT = 4096  # a chunk shorter than this is searched by find alone (a 1 KB message)


def scan_data(stream: bytes, skip: int) -> tuple[bytes | memoryview, int, int]:
    """One pass over DATA bytes: (content, where held-back bytes start, after-marker).

    ``stream`` starts with ``skip`` bytes already handed out (or the CRLF the
    start of DATA counts as following), kept only so that a CRLF "." across
    the boundary is seen. Every CRLF "." is found by a ``find`` of its "."
    (memchr: a run without a dot, such as base64, is crossed at memory speed)
    checked for the CRLF before it. Each such step costs what ``find`` would
    spend on ``_PROBE_COST`` bytes: where dots are dense (text) the credit runs
    out and ``_SPAN`` bytes at a time are searched for CRLF "." by one
    ``find`` (a chunk under ``_SHORT`` bytes from the start), until a memchr
    step shows the dots are sparse again. A CRLF "." followed by CRLF is the end
    marker (the third value is the offset after it, else -1); followed by
    nothing yet or a lone CR it may still become one, so the "." and what
    follows are held back (the second value); otherwise the "." is dropped
    (dot-unstuffing). Content that is one run of ``stream`` is not copied:
    ``stream`` itself, or a memoryview of it (the last chunk, before the
    marker); only stuffed dots make a joined copy.
    """
    pieces: list[bytes | memoryview] = []
    start = skip  # content not yet taken starts here
    pos = 0  # a CRLF "." not yet found starts here or later
    credit = _CREDIT if len(stream) >= _SHORT else 0  # a short chunk: one find, as it was
    find = stream.find
    while True:
        if credit > 0:  # memchr to the next ".": is it after a CRLF?
            dot = find(b".", pos + 2)
            if dot < 0:
                break
            if not stream.startswith(b"\r\n", dot - 2):
                credit += dot - pos - _PROBE_COST  # far apart, dots pay for their steps
                pos = dot - 1
                continue
            i = dot - 2
        else:  # dots are dense here: search a span for CRLF "." itself
            i = find(b"\r\n.", pos, pos + _SPAN)
            if i < 0:
                if pos + _SPAN >= len(stream):
                    break
                pos += _SPAN - 2  # a CRLF "." across the span's end is found in the next
                credit = 1  # one step: the next dot's distance decides how to go on
                continue
        after = stream[i + 3 : i + 5]
        if after == b"\r\n":  # the end marker
            pieces.append(memoryview(stream)[start : i + 2])
            return _joined(pieces), i + 2, i + 5
        if after in (b"", b"\r"):  # may still become the marker: wait for more
            pieces.append(memoryview(stream)[start : i + 2])
            return _joined(pieces), i + 2, -1
        pieces.append(memoryview(stream)[start : i + 2])  # a stuffed dot: drop it
        start = pos = i + 3
    if not pieces and start == 0:
        return stream, len(stream), -1
    pieces.append(memoryview(stream)[start:])
    return _joined(pieces), len(stream), -1


def _joined(pieces: list[bytes | memoryview]) -> bytes | memoryview:
    """One piece as it is (a view: no copy), several joined."""
    return pieces[0] if len(pieces) == 1 else b"".join(pieces)
