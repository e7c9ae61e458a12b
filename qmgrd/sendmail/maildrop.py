"""The maildrop queue: files written by ``sendmail`` and read (untrusted) by the pickup.

Layout
------
``maildrop_directory`` (default ``$queue_directory/maildrop``) holds one
file per submitted message, named by a queue id that the submitting
``sendmail`` generated. A writer creates ``.ID`` (O_EXCL, mode 0644 as
Postfix's maildrop files: the directory is not listable by submitters, so
names cannot be found), writes, fsyncs, then renames it to ``ID`` and fsyncs
the directory: a file without a leading dot is complete. ``.wakeup`` is a
FIFO: a writer that can open it (the daemon holds the read end while it
runs) writes one byte to wake the pickup at once.

File format (version 1)
-----------------------
An envelope of text lines, then an empty line, then the message as given
(line endings as the program wrote them)::

    qmgrd-maildrop 1
    S sender            (exactly one; empty = null sender)
    F full name         (optional, sendmail -F)
    N notify            (optional, DSN NOTIFY: NEVER or SUCCESS,FAILURE,DELAY)
    R ret               (optional, FULL or HDRS)
    V envid             (optional)
    T recipient         (one or more)

The reader trusts nothing: `read_maildrop` enforces the magic line, at most
`MAX_LINE` bytes per envelope line, printable UTF-8 without control
characters, at most `MAX_RECIPIENTS` recipients and ``size_limit`` content
bytes, and raises `MaildropError` naming the reason otherwise. It reads at
most ``MAX_ENVELOPE`` + ``size_limit`` + 1 bytes whatever the file's size.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

MAGIC = b"qmgrd-maildrop 1"
MAX_LINE = 2048
MAX_RECIPIENTS = 10000
MAX_ENVELOPE = MAX_LINE * (MAX_RECIPIENTS + 8)
WAKEUP = ".wakeup"
TEMP_PREFIX = "."
NOTIFY_WORDS = frozenset({"NEVER", "SUCCESS", "FAILURE", "DELAY"})


class MaildropError(Exception):
    """A maildrop file that is not valid (the reason is the message)."""


@dataclass(frozen=True, slots=True)
class MaildropMessage:
    """One submission: envelope and content bytes."""

    sender: str
    recipients: tuple[str, ...]
    content: bytes
    full_name: str = ""
    notify: frozenset[str] = frozenset()
    ret: str | None = None
    envid: str | None = None


def _clean(value: str, what: str) -> str:
    if any(ord(c) < 32 or ord(c) == 127 for c in value):
        raise MaildropError(f"control character in {what}")
    return value


def encode_maildrop(message: MaildropMessage) -> bytes:
    """The file's bytes (the writer's side); MaildropError for values that cannot be written."""
    lines = [MAGIC, b"S " + _clean(message.sender, "sender").encode()]
    if message.full_name:
        lines.append(b"F " + _clean(message.full_name, "full name").encode())
    if message.notify:
        lines.append(b"N " + ",".join(sorted(message.notify)).encode())
    if message.ret:
        lines.append(b"R " + message.ret.encode())
    if message.envid:
        lines.append(b"V " + _clean(message.envid, "envid").encode())
    if not message.recipients:
        raise MaildropError("no recipients")
    lines.extend(b"T " + _clean(r, "recipient").encode() for r in message.recipients)
    for line in lines:
        if len(line) > MAX_LINE:
            raise MaildropError("envelope value too long")
    return b"\n".join(lines) + b"\n\n" + message.content


def _read_bounded(fd: int, limit: int) -> bytes:
    parts: list[bytes] = []
    total = 0
    while total <= limit:
        chunk = os.read(fd, min(1 << 20, limit + 1 - total))
        if not chunk:
            break
        parts.append(chunk)
        total += len(chunk)
    return b"".join(parts)


def read_maildrop(fd: int, size_limit: int) -> MaildropMessage:
    """Parse an open maildrop file (module doc); MaildropError with the reason."""
    data = _read_bounded(fd, MAX_ENVELOPE + size_limit)
    end = data.find(b"\n\n")
    if end < 0:
        raise MaildropError("no end of envelope")
    head, content = data[:end], data[end + 2 :]
    if len(content) > size_limit:
        raise MaildropError(f"message larger than message_size_limit ({size_limit} bytes)")
    return _parse(head, content)


def read_maildrop_envelope(fd: int) -> MaildropMessage:
    """The envelope of an open maildrop file, content left unread (``b""``); for mailq.

    Reads at most ``MAX_ENVELOPE`` + 2 bytes; MaildropError as `read_maildrop`.
    """
    data = _read_bounded(fd, MAX_ENVELOPE + 1)
    end = data.find(b"\n\n")
    if end < 0:
        raise MaildropError("no end of envelope")
    return _parse(data[:end], b"")


def _parse(head: bytes, content: bytes) -> MaildropMessage:
    """Validate the envelope lines (module doc) and build the message."""
    lines = head.split(b"\n")
    if lines[0] != MAGIC:
        raise MaildropError("not a qmgrd maildrop file")
    sender: str | None = None
    fields: dict[str, str] = {}
    recipients: list[str] = []
    for raw in lines[1:]:
        if len(raw) > MAX_LINE or len(raw) < 2 or raw[1:2] != b" ":
            raise MaildropError("malformed envelope line")
        try:
            value = _clean(raw[2:].decode("utf-8"), "envelope")
        except UnicodeDecodeError:
            raise MaildropError("envelope line is not UTF-8") from None
        kind = raw[:1]
        if kind == b"S":
            if sender is not None:
                raise MaildropError("two senders")
            sender = value
        elif kind == b"T":
            if not value or len(recipients) >= MAX_RECIPIENTS:
                raise MaildropError("empty recipient or too many recipients")
            recipients.append(value)
        elif kind in (b"F", b"N", b"R", b"V"):
            fields[kind.decode()] = value
        else:
            raise MaildropError(f"unknown envelope record {kind!r}")
    if sender is None or not recipients:
        raise MaildropError("missing sender or recipients")
    notify = frozenset(w.upper() for w in fields.get("N", "").split(",") if w)
    if not notify <= NOTIFY_WORDS or ("NEVER" in notify and len(notify) > 1):
        raise MaildropError("bad NOTIFY")
    ret = fields.get("R") or None
    if ret is not None and ret.upper() not in ("FULL", "HDRS"):
        raise MaildropError("bad RET")
    return MaildropMessage(
        sender=sender,
        recipients=tuple(recipients),
        content=content,
        full_name=fields.get("F", ""),
        notify=notify,
        ret=ret.upper() if ret else None,
        envid=fields.get("V") or None,
    )


def write_maildrop(directory: Path, queue_id: str, data: bytes, *, fsync: bool = True) -> Path:
    """Durably create ``directory/queue_id`` with ``data`` (temporary name, fsync, rename)."""
    temp = directory / (TEMP_PREFIX + queue_id)
    final = directory / queue_id
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
    try:
        try:
            os.fchmod(fd, 0o644)  # whatever the umask: the pickup must read it
            view = memoryview(data)
            while view:
                written = os.write(fd, view)
                view = view[written:]
            if fsync:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.rename(temp, final)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        raise
    if fsync:
        dfd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    return final


def wake_pickup(directory: Path) -> bool:
    """Poke a running daemon's pickup through the FIFO; False when nobody listens."""
    try:
        fd = os.open(directory / WAKEUP, os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return False  # no FIFO, or no reader (ENXIO): the daemon is stopped
    try:
        with contextlib.suppress(BlockingIOError):
            os.write(fd, b"w")
        return True
    finally:
        os.close(fd)


def ready_names(directory: Path) -> Sequence[str]:
    """Complete maildrop files (names without a leading dot), oldest name first."""
    try:
        names = [n for n in os.listdir(directory) if not n.startswith(TEMP_PREFIX)]
    except FileNotFoundError:
        return []
    return sorted(names)
