"""Message content for the SMTP DATA phase: chunked transparency encoding.

``DataEncoder`` turns the raw content, fed in arbitrary chunks, into what goes
on the wire after ``354``: every line ending becomes CRLF (a lone CR or LF too,
as aiosmtplib does for whole messages) and a line starting with ``.`` gets an
extra ``.`` (RFC 5321 §4.5.2). ``finish()`` adds the missing final CRLF and the
``.CRLF`` terminator.

Theory of operation: the only state that crosses a chunk boundary is
(a) whether the output so far ends at the start of a line (so a ``.`` at the
start of the next chunk is stuffed) and (b) a trailing CR whose meaning (CRLF
or lone CR) depends on the next byte. A trailing CR is held back and prepended
to the next chunk, so every chunk is normalized with whole-buffer regexes and
the result equals encoding the whole message at once (pinned by a property
test). Most mail arrives with CRLF line ends only: when the chunk's lines
(``bytes.splitlines``: breaks at CRLF, CR and LF) joined with CRLF give the
chunk back, every CR and every LF is part of a CRLF and the regex (a
substitution per line) is skipped; that check is one C pass and a ``memcmp``,
half the cost of counting CRs, LFs and CRLFs. The dot-stuffing is one
``bytes.replace`` over the whole chunk, done only when the chunk may need it: a
walk over its first ``DOT_WALK`` dots (``bytes.find``, a ``memchr``) looks for
one after an LF; most big content (attachments in base64, generated text) has
few dots, and the walk costs far less than the replace's search. A chunk with
more dots gets the replace without a decision (the bytes are the same either
way: the walk only skips a replace that would change nothing).

The CRLF-only check is most of a big message's encoding (~80 us of ~90 per
100 KB: ``bench/contentpath.py``); no cheaper exact check was found (counting
CR, LF and CRLF ~145 us; a regex for a lone CR alone ~45; deleting all but CR
and LF ~40 and still blind to a CR and an LF apart). Recording "clean" in the
queue file at intake would cost the listener the same pass over the same bytes
(measured: the queue manager's CPU per 100 KB message fell by ~0.18 ms, the
listener workers' rose by ~0.15), so it is not done.

``BytesContent`` is an in-memory ``ContentSource`` (tests, generated bounces).
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from dataclasses import dataclass

_LINE_ENDINGS = re.compile(rb"\r\n|\n|\r(?!\n)")
DOT_WALK = 32  # dots looked at one by one before a chunk gets the replace unexamined
_LF = 0x0A


def _crlf_only(data: bytes) -> bool:
    """Whether every CR and every LF in ``data`` is part of a CRLF (module doc).

    The lines joined with CRLF are a prefix of ``data`` only if each break
    between them is a CRLF (a lone LF differs where the CR would be, a lone CR
    where the LF would be); what follows the last line is a CRLF or nothing.
    """
    joined = b"\r\n".join(data.splitlines())
    tail = 2 if data.endswith(b"\r\n") else 0
    return len(data) == len(joined) + tail and data.startswith(joined)


def _may_start_a_line_with_a_dot(data: bytes) -> bool:
    """False only when no ``.`` after the first byte follows an LF (module doc).

    Every CRLF followed by a dot has an LF before that dot, so False means the
    replace would change nothing. More than ``DOT_WALK`` dots: True without looking further.
    """
    find = data.find
    pos = find(b".", 1)
    for _ in range(DOT_WALK):
        if pos < 0:
            return False
        if data[pos - 1] == _LF:
            return True
        pos = find(b".", pos + 1)
    return pos >= 0


@dataclass(slots=True, eq=False)
class DataEncoder:
    """Incremental CRLF normalization and dot-stuffing for one DATA transfer."""

    _at_line_start: bool = True
    _held_cr: bool = False

    def feed(self, chunk: bytes) -> bytes:
        """Encode the next chunk of content; may hold back one trailing CR."""
        data = b"\r" + chunk if self._held_cr else chunk
        self._held_cr = data.endswith(b"\r")
        if self._held_cr:
            data = data[:-1]
        if not data:
            return b""
        if not _crlf_only(data):
            data = _LINE_ENDINGS.sub(b"\r\n", data)
        if self._at_line_start and data.startswith(b"."):
            data = b"." + data
        if _may_start_a_line_with_a_dot(data):
            data = data.replace(b"\r\n.", b"\r\n..")
        self._at_line_start = data.endswith(b"\r\n")
        return data

    def finish(self) -> bytes:
        """The bytes that end the transfer: a final CRLF if needed, then ``.CRLF``."""
        tail = b""
        if self._held_cr:
            tail = b"\r\n"
            self._held_cr = False
        elif not self._at_line_start:
            tail = b"\r\n"
        self._at_line_start = True
        return tail + b".\r\n"


def encode_data(content: bytes) -> bytes:
    """Encode a whole message for DATA (convenience for tests and small messages)."""
    enc = DataEncoder()
    return enc.feed(content) + enc.finish()


@dataclass(frozen=True, slots=True)
class BytesContent:
    """A ``ContentSource`` over bytes in memory."""

    data: bytes

    @property
    def size(self) -> int:
        """Content size in bytes."""
        return len(self.data)

    async def chunks(self, chunk_size: int = 65536) -> AsyncIterator[bytes]:
        """Yield the content in ``chunk_size`` pieces."""
        for start in range(0, len(self.data), chunk_size):
            yield self.data[start : start + chunk_size]
