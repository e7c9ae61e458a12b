"""The SMTP server protocol as a pure state machine: bytes in, events out (sans-IO).

Theory of operation
-------------------
In the spirit of h11, this module owns no socket, task or clock. The caller
(``qmgrd.listener.session``) feeds whatever bytes arrived with
``receive_data`` (``receive_eof`` at end of stream) and pulls events with
``next_event`` until it returns ``None`` ("need more data"). Bytes are only
looked at when an event is pulled, so pipelined commands (RFC 2920) simply
wait in the buffer: the caller handles one command, replies, and pulls the
next. The caller must not pull events while it is still working on one
(the next command may depend on its outcome, e.g. RCPT after a refused MAIL).

The reader is in one of three framing modes:

``COMMAND``
    A line ends at LF (CRLF or a bare LF, as Postfix accepts); the event is
    ``Command(verb, arg)`` with the verb upper-cased and the argument as
    text (UTF-8, undecodable bytes kept with ``surrogateescape``). A line
    longer than ``command_limit`` is discarded as it arrives (memory stays
    bounded whatever its length) and reported as one ``LineTooLong``.
``DATA``
    Entered by ``start_data()`` (the caller has answered 354). The message
    ends only at ``CRLF "." CRLF`` (RFC 5321 §4.1.1.4); the start of the
    stream counts as following a CRLF, so an empty message is "." CRLF. A
    bare LF or CR never ends DATA ("." after a bare LF is ordinary text), so
    a message cannot smuggle a second transaction past a next hop that is
    stricter than we are. A "." at the start of a line (after CRLF) is
    removed (dot-unstuffing, §4.5.2). Content is handed out as ``Content``
    events as it arrives, holding back only a "." (or "." CR) that follows a
    CRLF at the end of a chunk, since it may start the end marker; the last
    two bytes handed out are kept to see a CRLF "." across chunks.
    ``DataEnd(size)`` follows, and bytes after the marker are read as
    commands again. Each received chunk is scanned once (``dotscan.scan_data``:
    memchr for a "." or ``find`` of CRLF "."); a chunk without a stuffed
    dot or the marker, that does not start a line with ".", is handed on as
    the very object received, and the content before the marker as a view
    of its chunk (a 100 KB message is not copied here). Nothing
    here limits the size: the caller counts and stops storing
    (``message_size_limit``).
``AUTH``
    Entered by ``expect_auth_line()`` (the caller sent a 334 challenge): the
    next line is an ``AuthLine`` (RFC 4954 §4 lines may be 12288 octets),
    then the mode returns to ``COMMAND``.

Memory: the buffer holds at most one read plus an incomplete command line of
at most ``command_limit`` bytes; DATA never accumulates (the chunks received
since the last event, and at most two held-back bytes). ``Closed`` is the
last event after ``receive_eof`` (with ``in_data`` telling whether a message
was cut off); pulling again after it returns ``Closed`` again.

The SMTP dialogue state (``Dialogue``) is kept apart from framing: a phase
per session (``Phase``) and a transition table; a command out of sequence is
answered with Postfix's 503 text by ``sequence_error``, and an illegal move
asked of ``Dialogue`` is a bug (``InvariantError``).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import NamedTuple

from qmgrd.errors import InvariantError
from qmgrd.listener.dotscan import scan_data

COMMAND_LIMIT = 4096  # room for ORCPT/ENVID (RFC 3461 §5: up to 500 extra octets)
AUTH_LINE_LIMIT = 12288  # RFC 4954 §4


# The events made for every message (Command, Content, DataEnd) are named
# tuples, not frozen dataclasses: as immutable, but built by one tuple.__new__
# where a frozen dataclass's __init__ pays an object.__setattr__ per field
# (measured: callgrind, bench/intakepath.py). Their tuple nature is harmless:
# the session and transaction tell events apart with isinstance only, and no
# event of these has zero fields (an empty tuple would be false). The rare
# ones stay frozen dataclasses. The hot paths below build them with
# ``tuple.__new__(cls, fields)`` itself: a NamedTuple's own ``__new__`` is a
# Python function that calls it (half the cost of making the event).
class Command(NamedTuple):
    """One command line: ``verb`` upper-cased, ``arg`` the rest after one space."""

    verb: str
    arg: str


@dataclass(frozen=True, slots=True)
class LineTooLong:
    """A command (or AUTH) line exceeded its limit; it was discarded."""


@dataclass(frozen=True, slots=True)
class AuthLine:
    """The client's answer to a 334 challenge, without its line ending."""

    line: bytes


class Content(NamedTuple):
    """Message bytes, already dot-unstuffed (possibly empty); a view where no copy was needed."""

    data: bytes | memoryview


class DataEnd(NamedTuple):
    """The end-of-data marker was read; ``size`` is the unstuffed message size."""

    size: int


@dataclass(frozen=True, slots=True)
class Closed:
    """The client closed its side; ``in_data`` if that cut a message off."""

    in_data: bool


Event = Command | LineTooLong | AuthLine | Content | DataEnd | Closed


class Mode(enum.Enum):
    """What the next bytes from the client are."""

    COMMAND = "command"
    DATA = "data"
    AUTH = "auth"
    CLOSED = "closed"


_new = tuple.__new__  # the events' construction without their Python __new__ (above)
# Enum members read through their class cost a metaclass lookup each: read once here.
_COMMAND, _DATA, _AUTH, _CLOSED = Mode.COMMAND, Mode.DATA, Mode.AUTH, Mode.CLOSED
# Lines that are a verb alone, upper-cased: the very Command the general path makes
# (Command is frozen, so one instance serves every session).
_BARE = {
    verb.encode(): Command(verb, "")
    for verb in ("DATA", "QUIT", "RSET", "NOOP", "STARTTLS", "HELP", "VRFY")
}


class ServerProtocol:
    """Framing of one SMTP server connection (see the module docstring)."""

    __slots__ = (
        "_buf",
        "_discarding",
        "_eof",
        "_held",
        "_parts",
        "_pending",
        "_prefix",
        "_size",
        "command_limit",
        "mode",
    )

    def __init__(self, *, command_limit: int = COMMAND_LIMIT) -> None:
        if command_limit < 512:  # RFC 5321 §4.5.3.1.4
            raise InvariantError(f"command_limit {command_limit} < 512")
        self.command_limit = command_limit
        self.mode = _COMMAND
        self._buf = bytearray()
        self._eof = False
        self._discarding = False  # inside an overlong line, until its LF
        self._parts: list[bytes] = []  # DATA: chunks received, not yet scanned (no copy)
        self._held = b""  # DATA: "." or "." CR after a CRLF: may start the end marker
        self._prefix = b""  # DATA: the last two stream bytes handed out (or the start's CRLF)
        self._size = 0  # DATA: unstuffed bytes handed out so far
        self._pending: DataEnd | None = None  # due right after the last Content

    @property
    def buffered(self) -> int:
        """Bytes received and not yet turned into events (for flow control)."""
        return len(self._buf) + len(self._held) + sum(len(p) for p in self._parts)

    def receive_data(self, data: bytes) -> None:
        """Append bytes from the client; call ``next_event`` to get what they mean."""
        if self._eof:
            raise InvariantError("receive_data after receive_eof")
        if self.mode is _DATA:
            self._parts.append(data)  # scanned whole by _data_event: no copy here
        else:
            self._buf += data

    def receive_eof(self) -> None:
        """The client closed its side of the connection."""
        self._eof = True

    def start_data(self) -> None:
        """The caller answered DATA with 354: the following bytes are the message."""
        if self.mode is not _COMMAND:
            raise InvariantError(f"start_data in mode {self.mode.name}")
        self.mode = _DATA
        self._prefix = b"\r\n"  # the start of the stream counts as following a CRLF
        self._held = b""
        self._size = 0

    def expect_auth_line(self) -> None:
        """The caller sent a 334 challenge: the next line is the client's response."""
        if self.mode is not _COMMAND:
            raise InvariantError(f"expect_auth_line in mode {self.mode.name}")
        self.mode = _AUTH

    def next_event(self) -> Event | None:
        """The next event, or None when more data is needed."""
        if self._pending is not None:
            done, self._pending = self._pending, None
            return done
        mode = self.mode
        if mode is _CLOSED:
            return Closed(in_data=False)  # again: nothing more will come
        event: Event | None
        if mode is _DATA:
            event = self._data_event()
        elif mode is _AUTH:
            event = self._line_event(AUTH_LINE_LIMIT)
        else:
            buf = self._buf
            if not buf and not self._eof:  # between commands: nothing to look at
                return None
            end = buf.find(b"\n")
            if 0 < end <= self.command_limit and buf[end - 1] == 0x0D and not self._discarding:
                # The usual, inline: one whole CRLF line of a sane length (_line_event's
                # steps for it; a call less per command).
                raw = bytes(buf[: end - 1])
                del buf[: end + 1]
                bare = _BARE.get(raw)
                if bare is not None:
                    return bare
                verb, _, arg = raw.decode("utf-8", "surrogateescape").partition(" ")
                return _new(Command, (verb.upper(), arg))  # Command(verb.upper(), arg)
            event = self._line_event(self.command_limit)
        if event is None and self._eof:
            in_data = self.mode is _DATA
            self.mode = _CLOSED
            self._buf.clear()
            self._parts.clear()
            self._held = b""
            return Closed(in_data)
        return event

    # -- lines -------------------------------------------------------------------

    def _line_event(self, limit: int) -> Event | None:
        buf = self._buf
        end = buf.find(b"\n")
        if end < 0:
            if len(buf) > limit:
                self._discarding = True
                buf.clear()
            return None
        # the line without its LF, and without a CR before it (one copy out of the buffer)
        raw = bytes(buf[: end - 1]) if end and buf[end - 1] == 0x0D else bytes(buf[:end])
        del buf[: end + 1]
        if self._discarding or end > limit:  # ``end``: the line's length before a CR is cut
            self._discarding = False
            self.mode = _COMMAND
            return LineTooLong()
        if self.mode is _AUTH:
            self.mode = _COMMAND
            return AuthLine(raw)
        bare = _BARE.get(raw)
        if bare is not None:
            return bare
        text = raw.decode("utf-8", "surrogateescape")
        verb, _, arg = text.partition(" ")
        return _new(Command, (verb.upper(), arg))  # Command(verb.upper(), arg)

    # -- DATA --------------------------------------------------------------------

    def _data_event(self) -> Event | None:
        if self._buf:  # bytes read ahead before start_data (a client that did not wait)
            self._parts.insert(0, bytes(self._buf))
            self._buf.clear()
        if not self._parts:
            return None
        chunk = self._parts[0] if len(self._parts) == 1 else b"".join(self._parts)
        self._parts.clear()
        if not chunk:
            return None
        prefix = self._prefix
        if (
            self._held
            or (chunk[:1] == b"." and prefix.endswith(b"\r\n"))
            or (chunk[:2] == b"\n." and prefix.endswith(b"\r"))
        ):  # a CRLF "." may span the boundary: scan it with the bytes before
            stream = prefix + self._held + chunk
            skip = len(prefix)
        else:  # the common case: the chunk alone, handed on as it is
            stream = chunk
            skip = 0
        out, held_from, end = scan_data(stream, skip)
        self._size += len(out)
        if end >= 0:
            self._buf[:] = stream[end:]
            self._held = b""
            self.mode = _COMMAND
            self._pending = _new(DataEnd, (self._size,))  # DataEnd(self._size)
            return _new(Content, (out,))  # Content(out)
        self._held = stream[held_from:]
        self._prefix = (prefix + stream[:held_from])[-2:] if held_from < 2 else (
            stream[held_from - 2 : held_from]
        )
        return _new(Content, (out,)) if out else None  # nothing new: wait for more


# -- the dialogue ----------------------------------------------------------------------


class Phase(enum.Enum):
    """Where a session is in the SMTP dialogue (RFC 5321 §4.1.4)."""

    GREETED = "greeted"  # no HELO/EHLO yet
    READY = "ready"  # HELO/EHLO seen, no transaction
    MAIL = "mail"  # MAIL accepted, no recipient yet
    RCPT = "rcpt"  # at least one recipient accepted

    # Members are singletons compared by identity: hash them by identity too, in C
    # (Enum's own __hash__ is Python, paid at every table lookup of a command).
    __hash__ = object.__hash__


_MAIL, _RCPT = Phase.MAIL, Phase.RCPT


_HELO_FIRST = "503 5.5.1 Error: send HELO/EHLO first"
# (verb, phase) -> the reply to a command out of sequence (Postfix's smtpd texts).
_SEQUENCE: dict[tuple[str, Phase], str] = {
    ("MAIL", Phase.GREETED): _HELO_FIRST,
    ("MAIL", Phase.MAIL): "503 5.5.1 Error: nested MAIL command",
    ("MAIL", Phase.RCPT): "503 5.5.1 Error: nested MAIL command",
    ("RCPT", Phase.GREETED): _HELO_FIRST,
    ("RCPT", Phase.READY): "503 5.5.1 Error: need MAIL command",
    ("DATA", Phase.GREETED): _HELO_FIRST,
    ("DATA", Phase.READY): "503 5.5.1 Error: need RCPT command",
    ("DATA", Phase.MAIL): "554 5.5.1 Error: no valid recipients",
    ("AUTH", Phase.GREETED): _HELO_FIRST,
    ("AUTH", Phase.MAIL): "503 5.5.1 Error: MAIL transaction in progress",
    ("AUTH", Phase.RCPT): "503 5.5.1 Error: MAIL transaction in progress",
}
# Legal moves: event -> phases it may start from -> the phase it leads to.
_MOVES: dict[str, dict[Phase, Phase]] = {
    "helo": {p: Phase.READY for p in Phase},
    "mail": {Phase.READY: Phase.MAIL},
    "rcpt": {Phase.MAIL: Phase.RCPT, Phase.RCPT: Phase.RCPT},
    "end": {Phase.MAIL: Phase.READY, Phase.RCPT: Phase.READY},
    "reset": {
        Phase.GREETED: Phase.GREETED,
        Phase.READY: Phase.READY,
        Phase.MAIL: Phase.READY,
        Phase.RCPT: Phase.READY,
    },
}


class Dialogue:
    """The session's phase and HELO facts; moves are checked against ``_MOVES``."""

    __slots__ = ("extended", "helo_name", "phase")

    def __init__(self) -> None:
        self.phase = Phase.GREETED
        self.extended = False  # EHLO (not HELO) was used: ESMTP parameters allowed
        self.helo_name: str | None = None

    def sequence_error(self, verb: str) -> str | None:
        """The reply for ``verb`` out of sequence now, or None if it may proceed."""
        return _SEQUENCE.get((verb, self.phase))

    def move(self, event: str) -> None:
        """Apply a dialogue event (helo, mail, rcpt, end, reset); InvariantError if illegal."""
        target = _MOVES[event].get(self.phase)
        if target is None:
            raise InvariantError(f"dialogue: {event} in phase {self.phase.name}")
        self.phase = target

    def helo(self, name: str, *, extended: bool) -> None:
        """HELO or EHLO: a new start, any transaction is dropped (RFC 5321 §4.1.4)."""
        self.move("helo")
        self.helo_name = name
        self.extended = extended

    @property
    def in_transaction(self) -> bool:
        return self.phase is _MAIL or self.phase is _RCPT
