"""`HeaderStream`: the header section of a message, cut into logical headers, streaming.

Contract
--------
A subclass implements the hooks; the caller feeds the message's bytes in
chunks of any size with `feed` (writing what it returns) and calls `finish`.

- ``_begin(out)``: once, before the first header (``_eol`` is known then:
  CR LF unless the first line ends with a bare LF);
- ``_header(raw, truncated) -> bytes``: each logical header (its lines with
  their endings); returns what to write instead (``raw`` to keep it);
  ``_name_len`` is then its name's length (`header_name_length` of its first
  line, as it came: when ``truncated``, of the line before any cut);
- ``_end(out)``: once, when the header section ends (before the empty line);
- ``_truncated()``: a header was cut at ``limit`` bytes; ``_done()``: at finish.

Postfix's rules (is_header.c, mime_state.c): the section ends at the empty
line or at the first line that is neither a header (`header_name_length`)
nor a continuation; an empty line is then inserted before that line. One
header is held at a time, at most ``limit`` bytes; the excess of a longer
header (one long line or many continuation lines) is dropped and the header
is passed on truncated. Body bytes are passed through untouched, never split
into lines. Memory: ``limit`` plus the chunk being fed. Never raises for any
input.
"""

from __future__ import annotations

import enum

from qmgrd.cleanup.headers import header_name_length, line_ending

_WINDOW = 16384  # a view in the header section is read as bytes this much at a time


def _line_end(view: memoryview, at: int) -> int:
    """Where the line starting at ``at`` in ``view`` ends (after its LF), or the view's end."""
    for start in range(at, len(view), _WINDOW):
        nl = bytes(view[start : start + _WINDOW]).find(b"\n")
        if nl >= 0:
            return start + nl + 1
    return len(view)


class _State(enum.Enum):
    START = "start"
    HEADERS = "headers"
    BODY = "body"


class HeaderStream:
    """The streaming machinery; see the module doc for the hooks."""

    __slots__ = (
        "_cur",
        "_cur_size",
        "_cur_truncated",
        "_eol",
        "_head",
        "_name_len",
        "_partial",
        "_partial_drop",
        "_partial_kind",
        "_state",
        "limit",
    )

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._state = _State.START
        self._eol = b"\r\n"
        self._head = bytearray()  # the start of the message until its first line ending
        self._cur: list[bytes] = []  # lines of the header being collected
        self._cur_size = 0
        self._cur_truncated = False
        self._name_len = 0  # header_name_length of the header being collected
        self._partial = bytearray()  # an incomplete line (headers only)
        self._partial_drop = False
        self._partial_kind: str | None = None  # "crlf" / "lf": the ending of a cut line

    # -- hooks -------------------------------------------------------------------------

    def _begin(self, out: bytearray) -> None:
        """Before the first header."""

    def _header(self, raw: bytes, truncated: bool) -> bytes:
        """One logical header; what to write."""
        return raw

    def _end(self, out: bytearray) -> None:
        """The header section ended (before the empty line)."""

    def _truncated(self) -> None:
        """A header was cut at the limit."""

    def _done(self) -> None:
        """At finish."""

    def _end_section(self, out: bytearray, *, separator: bool) -> None:
        self._end(out)
        if separator:
            out += self._eol
        self._state = _State.BODY

    def _encode_lines(self, text: str) -> bytes:
        """Text lines (joined by newlines) as bytes with the message's line ending."""
        lines = text.replace("\r\n", "\n").split("\n")
        return b"".join(
            line.encode("utf-8", "surrogateescape") + self._eol for line in lines if line
        )

    # -- public ----------------------------------------------------------------------------

    @property
    def in_headers(self) -> bool:
        """True until the header section has ended."""
        return self._state is not _State.BODY

    def feed(self, data: bytes) -> bytes:
        """Process a chunk; the bytes to write now (possibly empty).

        In the body, ``data`` itself is returned (no copy: a 100 KB message's
        body passes through untouched). ``feed_parts`` does not join the header
        section's bytes with the body's that follow them in the same chunk.
        """
        head, body = self.feed_parts(data)
        if not head:
            return bytes(body)  # ``data`` itself in the body (bytes(b) is b)
        return head + body if body else head

    def feed_parts(self, data: bytes | memoryview) -> tuple[bytes, bytes | memoryview]:
        """Process a chunk: (header bytes to write now, then body bytes to write as given).

        Written one after the other they are what ``feed`` returns; the body's
        part is ``data`` itself or a view of it (never copied). A view (the
        listener's last chunk of a message) is read as bytes ``_WINDOW`` bytes at
        a time while the header section lasts: its body is not copied either.
        """
        if self._state is _State.BODY:
            return b"", data
        if isinstance(data, bytes):
            return self._feed_bytes(data)
        out = bytearray()
        at = 0
        while at < len(data):  # bounded: every round takes at least one byte
            # The first line is read whole, as one bytes chunk shows it: its ending decides ours.
            end = _line_end(data, at) if self._state is _State.START else at + _WINDOW
            window = bytes(data[at:end])
            head, body = self._feed_bytes(window)
            out += head
            if not self.in_headers:  # the rest is a view of ``data`` (no copy)
                return bytes(out), data[at + len(window) - len(body) :]
            at += len(window)
        return bytes(out), b""

    def _feed_bytes(self, raw: bytes) -> tuple[bytes, bytes | memoryview]:
        """``feed_parts`` for a chunk that is ``bytes`` and starts in the header section."""
        out = bytearray()
        if self._state is _State.START:
            # the line ending of the first line decides ours: wait for it (bounded)
            if self._head:  # the first line so far: this chunk continues it
                self._head += raw
                raw = bytes(self._head)
                self._head.clear()
            if b"\n" not in raw and len(raw) <= self.limit:
                self._head += raw
                return b"", b""
            self._start(raw, out)
        pos = self._feed_started(raw, out)
        return bytes(out), memoryview(raw)[pos:] if pos < len(raw) else b""

    def _feed_started(self, data: bytes, out: bytearray) -> int:
        """Headers line by line into ``out``; where the body starts in ``data`` (or its length).

        The bytes from there on are the body's, to be written as they are.
        """
        pos, end = 0, len(data)
        limit = self.limit
        while pos < end and self._state is _State.HEADERS:
            nl = data.find(b"\n", pos)
            stop = end if nl < 0 else nl + 1
            if nl >= 0 and stop - pos <= limit and not self._partial and not self._partial_drop:
                self._line(data[pos:stop], False, out)  # a whole line in this chunk: as is
                pos = stop
                continue
            self._add_partial(data[pos:stop], out)
            pos = stop
            if nl >= 0 and self._state is _State.HEADERS:
                line, truncated = bytes(self._partial), self._partial_drop
                if truncated:
                    ending = {"lf": b"\n", "crlf": b"\r\n"}.get(self._partial_kind or "", self._eol)
                    line = line.rstrip(b"\r\n") + ending
                self._partial.clear()
                self._partial_drop = False
                self._partial_kind = None
                self._line(line, truncated, out)
        return pos

    def finish(self) -> bytes:
        """End of message: the remaining bytes to write."""
        out = bytearray()
        if self._state is _State.START:
            data = bytes(self._head)
            self._head.clear()
            self._start(data, out)
            out += memoryview(data)[self._feed_started(data, out) :]
        if self._state is _State.HEADERS:
            if self._partial:
                line, truncated = bytes(self._partial), self._partial_drop
                self._partial.clear()
                self._line(line + self._eol, truncated, out)
            if self._state is _State.HEADERS:
                self._flush_header(out)
                self._end_section(out, separator=False)
        self._done()
        return bytes(out)

    # -- header section ----------------------------------------------------------------

    def _start(self, data: bytes, out: bytearray) -> None:
        first_nl = data.find(b"\n")
        if (first_nl > 0 and data[first_nl - 1] == 0x0D) or first_nl < 0:
            self._eol = b"\r\n"
        else:
            self._eol = b"\n"
        self._state = _State.HEADERS
        self._begin(out)

    def _add_partial(self, piece: bytes, out: bytearray) -> None:
        """Append to the incomplete line, classifying and cutting a line that grows too long."""
        limit = self.limit
        if self._partial_drop:
            self._track_cr(piece)
            return
        if len(self._partial) + len(piece) <= limit:
            self._partial += piece
            return
        # Too long to hold: decide now what this line is.
        # The line's first ``limit`` bytes, wherever the chunks cut it (a whole line: the same).
        probe = (bytes(self._partial) + piece[: max(0, limit)])[: max(0, limit)]
        continuation = probe[:1] in (b" ", b"\t") and bool(self._cur)
        if continuation or header_name_length(probe) > 0:
            room = max(0, limit - len(self._partial))
            self._partial += piece[:room]
            self._partial_drop = True
            self._track_cr(piece)
            return
        # Not a header: the header section ends before this line; the body takes it whole.
        self._flush_header(out)
        self._end_section(out, separator=True)
        out += self._partial
        out += piece
        self._partial.clear()

    def _track_cr(self, piece: bytes) -> None:
        """Remember whether a dropped piece ended a CR LF line (for its re-added ending)."""
        if piece.endswith(b"\n"):
            self._partial_kind = "crlf" if piece.endswith(b"\r\n") else "lf"

    def _line(self, line: bytes, truncated: bool, out: bytearray) -> None:
        content = line.rstrip(b"\r\n")
        if not content:
            self._flush_header(out)
            self._end_section(out, separator=False)
            out += line  # the empty line itself
            return
        if content[:1] in (b" ", b"\t") and self._cur:
            self._add_to_header(line, truncated)
            return
        name_len = header_name_length(content)
        if name_len > 0:
            if self._cur:
                self._flush_header(out)
            self._name_len = name_len
            if truncated or len(line) > self.limit:
                self._add_to_header(line, truncated)
            else:  # _add_to_header's common case: a header starts, whole (it is not blank)
                self._cur.append(line)
                self._cur_size = len(line)
            return
        self._flush_header(out)
        self._end_section(out, separator=True)
        out += line

    def _add_to_header(self, line: bytes, truncated: bool) -> None:
        limit = self.limit
        if self._cur_truncated:
            return
        room = limit - self._cur_size
        if len(line) > room or truncated:
            if len(line) > room:
                line = line[: max(room, 0)].rstrip(b"\r\n") + line_ending(line)
            self._cur_truncated = True
        if line.strip():
            self._cur.append(line)
            self._cur_size += len(line)

    def _flush_header(self, out: bytearray) -> None:
        if not self._cur:
            return
        raw = b"".join(self._cur)
        if not raw.endswith(b"\n"):
            raw += self._eol
        truncated = self._cur_truncated
        self._cur = []
        self._cur_size = 0
        self._cur_truncated = False
        if truncated:
            self._truncated()
        out += self._header(raw, truncated)
