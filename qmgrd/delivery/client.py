"""The SMTP client protocol as pure state: replies in, commands out (sans-IO).

The client-side twin of ``qmgrd.listener.protocol``. Nothing here owns a
socket, a task or a clock; ``qmgrd.delivery.connection`` feeds the bytes that
arrive and writes the bytes asked for.

``ReplyParser`` (RFC 5321 §4.2): ``feed(data)`` then ``next_reply()`` until
None, or ``replies(append)`` for all complete replies at once. A reply is
lines ``ddd-text`` ending with a line ``ddd text`` (or ``ddd``); a line ends
at LF (a CR before it is dropped). The reply's code is its last line's; the
text is the lines' text joined by "\\n", decoded as UTF-8 with
``surrogateescape``. Bounds, so that a hostile server cannot make the client
grow or hang (the caller's timeouts bound the time):

- a line longer than ``line_limit`` bytes (with or without its LF) is a
  ``ReplyError`` as soon as it is seen: the buffer never holds more than one
  read plus ``line_limit`` bytes;
- a reply of more than ``line_count_limit`` lines is a ``ReplyError``;
- a line that does not start with three digits and a space, a dash or its end
  is a ``ReplyError``.
A ``ReplyError`` is final: the parser raises it again on every call.

``ehlo_extensions(reply)``: the EHLO keywords (lower case) and their
parameters; ``AUTH=...`` (old servers) counts as ``AUTH``.

``Envelope`` plans MAIL FROM, every RCPT TO and DATA (RFC 2920 §3.1). With
PIPELINING the whole group is one write and the replies are matched in order
(``probe``: an RSET goes first in the same write, the probe of a session taken
from the connection cache; its reply is ``rset_reply``);
without it each command is written after the previous reply. ``to_send()``
says what to write now (None: nothing); ``expected()`` says which command the
next reply answers (None: the envelope is done); ``receive(reply)`` records
it and returns what ``expected()`` would. Without PIPELINING no RCPT follows a
refused MAIL and no DATA follows when no recipient was accepted. With
PIPELINING those were already sent, so their replies are read (and ignored
after a refused MAIL) to keep the session in step. ``data_unwanted`` is True
when DATA got 354 although nothing should be sent: the caller ends the empty
message with a lone "." (RFC 2920 §3.1, as Postfix's smtp_proto.c does) and
RSETs before the session is used again.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple

from qmgrd.errors import InvariantError

REPLY_LINE_LIMIT = 8192  # RFC 5321 §4.5.3.1.5 says 512; real servers send longer (aiosmtplib's)
REPLY_LINE_COUNT_LIMIT = 200  # an EHLO reply has a dozen lines; endless continuations stop here
CRLF = b"\r\n"


class Reply(NamedTuple):
    """One SMTP reply: its code and its text (lines joined by "\\n", codes removed).

    Immutable like a frozen dataclass, but a NamedTuple: a delivery parses five replies,
    and ``ReplyParser`` builds each with one ``tuple.__new__`` (a frozen dataclass's
    ``__init__`` costs two ``object.__setattr__`` calls more, ~2,700 instructions a reply).
    """

    code: int
    message: str


_new_tuple = tuple.__new__  # Reply without the generated __new__ (the parser's hot path)


class ReplyError(Exception):
    """The server's reply breaks the protocol or a bound (module doc)."""


class ReplyParser:
    """Bounded framing of server replies (module doc)."""

    __slots__ = ("_buf", "_error", "_lines", "line_count_limit", "line_limit")

    def __init__(
        self,
        *,
        line_limit: int = REPLY_LINE_LIMIT,
        line_count_limit: int = REPLY_LINE_COUNT_LIMIT,
    ) -> None:
        if line_limit < 512 or line_count_limit < 1:  # RFC 5321 §4.5.3.1.5
            raise InvariantError(f"reply limits {line_limit}/{line_count_limit} too small")
        self.line_limit = line_limit
        self.line_count_limit = line_count_limit
        self._buf = b""
        self._lines: list[bytes] = []
        self._error: ReplyError | None = None

    @property
    def buffered(self) -> int:
        """Bytes received and not yet part of a complete reply line."""
        return len(self._buf)

    def feed(self, data: bytes) -> None:
        """Append bytes from the server."""
        self._buf = self._buf + data if self._buf else data

    def clear(self) -> None:
        """Drop everything unread (STARTTLS: plaintext after the 220 is never read)."""
        self._buf = b""
        self._lines.clear()

    def next_reply(self) -> Reply | None:
        """The next complete reply, None when more bytes are needed; ReplyError if broken."""
        out: list[Reply] = []
        self._parse(out.append, 1)
        return out[0] if out else None

    def replies(self, append: Callable[[Reply], None]) -> None:
        """Every complete reply, in order, to ``append``; ReplyError (after the replies
        before it) if broken. One call per read: a pipelined group's replies arrive together."""
        self._parse(append, 0)

    def _parse(self, append: Callable[[Reply], None], limit: int) -> None:
        """Complete replies to ``append``, at most ``limit`` of them (0: all)."""
        if self._error is not None:
            raise self._error
        buf = self._buf
        start = 0
        count = 0
        line_limit = self.line_limit
        try:
            while True:
                end = buf.find(b"\n", start)
                if end < 0:
                    if len(buf) - start > line_limit:
                        raise ReplyError(f"reply line longer than {line_limit} bytes")
                    return
                line = buf[start:end]
                start = end + 1
                if len(line) > line_limit:
                    raise ReplyError(f"reply line longer than {line_limit} bytes")
                if line.endswith(b"\r"):
                    line = line[:-1]
                sep = line[3:4]
                if not line[:3].isdigit() or sep not in (b" ", b"-", b""):
                    raise ReplyError("malformed reply line")
                if sep == b"-":
                    self._lines.append(line)
                    if len(self._lines) >= self.line_count_limit:
                        raise ReplyError(f"reply longer than {self.line_count_limit} lines")
                    continue
                if self._lines:  # the last line of a multi-line reply
                    lines, self._lines = self._lines, []
                    lines.append(line)
                    text = b"\n".join([part[4:] for part in lines])
                else:  # most replies are one line
                    text = line[4:]
                append(_new_tuple(Reply, (int(line[:3]), text.decode("utf-8", "surrogateescape"))))
                count += 1
                if count == limit:
                    return
        except ReplyError as exc:
            self._error = exc
            self._lines.clear()
            buf = b""
            start = 0
            raise
        finally:
            self._buf = buf[start:] if start else buf


def command_line(*args: bytes) -> bytes:
    """One command as it goes on the wire: the words joined by spaces, then CRLF."""
    return b" ".join(args) + CRLF


def ehlo_extensions(reply: Reply) -> dict[str, str]:
    """The keywords of an EHLO reply (lower case) with their parameters."""
    out: dict[str, str] = {}
    for line in reply.message.split("\n")[1:]:
        keyword, _, params = line.strip().partition(" ")
        keyword, eq, old_style = keyword.partition("=")  # "AUTH=LOGIN PLAIN"
        if eq:
            params = f"{old_style} {params}".strip()
        if keyword:
            key = keyword.lower()
            out[key] = f"{out[key]} {params}".strip() if key in out and params else params
    return out


class Step(enum.Enum):
    """The command a reply answers in an envelope."""

    RSET = "RSET"  # the probe of a cached session, at the head of a pipelined group
    MAIL = "MAIL FROM"
    RCPT = "RCPT TO"
    DATA = "DATA"


@dataclass(slots=True, eq=False)
class Envelope:
    """MAIL, RCPT and DATA with or without PIPELINING (module doc)."""

    mail: bytes  # the MAIL FROM line, CRLF included
    rcpts: list[tuple[int, bytes]]  # (recipient index, RCPT TO line)
    pipelining: bool
    probe: bool = False  # pipelined only: RSET at the head of the group
    rset_reply: Reply | None = None
    mail_reply: Reply | None = None
    rcpt_replies: dict[int, Reply] = field(default_factory=dict)
    data_reply: Reply | None = None
    _order: list[tuple[Step, int]] = field(default_factory=list)  # commands written, unanswered
    _next: int = 0  # non-pipelined: the next RCPT to write (index into rcpts)
    _sent_data: bool = False
    _started: bool = False

    def __post_init__(self) -> None:
        if not self.rcpts:
            raise InvariantError("an envelope needs a recipient")
        if self.probe and not self.pipelining:
            raise InvariantError("an RSET probe rides in a pipelined group only")

    @property
    def mail_ok(self) -> bool:
        """MAIL FROM was accepted."""
        return self.mail_reply is not None and self.mail_reply.code // 100 == 2

    @property
    def accepted(self) -> list[int]:
        """Indexes of the recipients accepted so far, in order (none after a refused MAIL)."""
        if not self.mail_ok:
            return []
        return [idx for idx, _ in self.rcpts if self.rcpt_replies[idx].code // 100 == 2]

    @property
    def data_unwanted(self) -> bool:
        """DATA got 354 although no recipient (or MAIL) was accepted."""
        reply = self.data_reply
        return reply is not None and reply.code == 354 and not self.accepted

    def to_send(self) -> bytes | None:
        """The bytes to write before the next reply is read, or None."""
        if not self._started:
            self._started = True
            if self.pipelining:
                self._order = [(Step.MAIL, -1), *((Step.RCPT, idx) for idx, _ in self.rcpts)]
                self._order.append((Step.DATA, -1))
                self._next = len(self.rcpts)
                self._sent_data = True
                group = self.mail + b"".join(line for _, line in self.rcpts) + b"DATA\r\n"
                if self.probe:
                    self._order.insert(0, (Step.RSET, -1))
                    return b"RSET\r\n" + group
                return group
            self._order = [(Step.MAIL, -1)]
            return self.mail
        if self.pipelining or self._order or self.mail_reply is None or not self.mail_ok:
            return None
        if self._next < len(self.rcpts):
            idx, line = self.rcpts[self._next]
            self._next += 1
            self._order.append((Step.RCPT, idx))
            return line
        if not self._sent_data and self.accepted:
            self._sent_data = True
            self._order.append((Step.DATA, -1))
            return b"DATA\r\n"
        return None

    def expected(self) -> tuple[Step, int] | None:
        """(command, recipient index or -1) the next reply answers; None when done."""
        return self._order[0] if self._order else None

    def receive(self, reply: Reply) -> tuple[Step, int] | None:
        """Record the reply to the oldest unanswered command; then what ``expected()`` says."""
        order = self._order
        if not order:
            raise InvariantError("envelope: a reply with no command outstanding")
        step, idx = order.pop(0)
        if step is Step.RSET:
            self.rset_reply = reply
        elif step is Step.MAIL:
            self.mail_reply = reply
        elif step is Step.RCPT:
            self.rcpt_replies[idx] = reply
        else:
            self.data_reply = reply
        return order[0] if order else None
