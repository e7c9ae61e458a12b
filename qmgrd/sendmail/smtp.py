"""``sendmail -bs``: SMTP on standard input and output, into the maildrop queue.

Postfix runs its SMTP server stand-alone for ``-bs``; this is the same
dialogue for a local program (git send-email, some monitoring agents): a
220 greeting, ``EHLO``/``HELO``, ``MAIL FROM``, ``RCPT TO``, ``DATA``
(dot-unstuffed), ``RSET``, ``NOOP``, ``VRFY`` (252), ``QUIT``. Each message
becomes one maildrop file (`command.submit`), so it is kept when the daemon
is stopped. Bounded: command lines of at most 2048 bytes (longer: 500), at
most `MAX_RECIPIENTS` recipients per message (452), ``message_size_limit``
(552, the rest of DATA is read and dropped), and `MAX_ERRORS` errors end the
session (421), as Postfix's ``smtpd_hard_error_limit``.
"""

from __future__ import annotations

import email.utils
from pathlib import Path
from typing import BinaryIO

from qmgrd.sendmail.command import EX_OK, Fatal, submit
from qmgrd.sendmail.maildrop import MaildropMessage, wake_pickup
from qmgrd.sendmail.options import Options

LINE_LIMIT = 2048
MAX_RECIPIENTS = 1000
MAX_ERRORS = 20


def serve(
    stdin: BinaryIO,
    stdout: BinaryIO,
    *,
    maildrop: Path,
    size_limit: int,
    opts: Options,
    host: str = "localhost",
) -> int:
    """Run one SMTP session; EX_OK at QUIT or end of input."""

    def reply(text: str) -> None:
        stdout.write(text.encode("utf-8", "replace") + b"\r\n")
        stdout.flush()

    reply(f"220 {host} ESMTP qmgrd (sendmail -bs)")
    sender: str | None = None
    recipients: list[str] = []
    errors = 0
    while True:
        raw = stdin.readline(LINE_LIMIT + 2)
        if not raw:
            return EX_OK
        if not raw.endswith(b"\n"):
            while raw and not raw.endswith(b"\n"):  # drain the over-long line
                raw = stdin.readline(LINE_LIMIT)
            reply("500 5.5.2 Error: line too long")
            errors += 1
            continue
        line = raw.rstrip(b"\r\n").decode("utf-8", "replace")
        verb, _, arg = line.partition(" ")
        verb = verb.upper()
        if errors >= MAX_ERRORS:
            reply("421 4.7.0 Error: too many errors")
            return EX_OK
        if verb in ("EHLO", "HELO"):
            sender, recipients = None, []
            if verb == "EHLO":
                extensions = ("PIPELINING", f"SIZE {size_limit}", "8BITMIME", "SMTPUTF8")
                reply(
                    "\r\n".join(
                        [f"250-{host}"]
                        + [f"250-{e}" for e in extensions[:-1]]
                        + [f"250 {extensions[-1]}"]
                    )
                )
            else:
                reply(f"250 {host}")
        elif verb == "MAIL":
            path = _path(arg, "FROM:")
            if path is None or sender is not None:
                reply(
                    "503 5.5.1 Error: nested MAIL command"
                    if sender is not None
                    else "501 5.5.4 Syntax: MAIL FROM:<address>"
                )
                errors += 1
                continue
            sender = path
            reply("250 2.1.0 Ok")
        elif verb == "RCPT":
            path = _path(arg, "TO:")
            if sender is None:
                reply("503 5.5.1 Error: need MAIL command")
                errors += 1
            elif not path:
                reply("501 5.5.4 Syntax: RCPT TO:<address>")
                errors += 1
            elif len(recipients) >= MAX_RECIPIENTS:
                reply("452 4.5.3 Error: too many recipients")
            else:
                recipients.append(path)
                reply("250 2.1.5 Ok")
        elif verb == "DATA":
            if sender is None or not recipients:
                reply("503 5.5.1 Error: need RCPT command")
                errors += 1
                continue
            reply("354 End data with <CR><LF>.<CR><LF>")
            content, complete, too_big = _read_data(stdin, size_limit)
            if not complete:
                return EX_OK
            if too_big:
                reply("552 5.3.4 Error: message file too big")
            else:
                try:
                    queue_id = submit(
                        maildrop,
                        MaildropMessage(
                            sender=sender,
                            recipients=tuple(recipients),
                            content=content,
                            notify=opts.notify,
                            ret=opts.ret,
                        ),
                    )
                except Fatal as exc:
                    reply(f"451 4.3.0 Error: queue file write error: {exc}")
                else:
                    wake_pickup(maildrop)
                    reply(f"250 2.0.0 Ok: queued as {queue_id}")
            sender, recipients = None, []
        elif verb == "RSET":
            sender, recipients = None, []
            reply("250 2.0.0 Ok")
        elif verb == "NOOP":
            reply("250 2.0.0 Ok")
        elif verb == "VRFY":
            reply("252 2.0.0 Send some mail, I'll try my best")
        elif verb == "QUIT":
            reply("221 2.0.0 Bye")
            return EX_OK
        else:
            reply("502 5.5.2 Error: command not recognized")
            errors += 1


def _path(arg: str, keyword: str) -> str | None:
    """``FROM:<a@b> PARAMS`` -> "a@b" ("" for <>); None on bad syntax."""
    if not arg.upper().startswith(keyword):
        return None
    rest = arg[len(keyword) :].strip()
    if rest.startswith("<"):
        end = rest.find(">")
        if end < 0:
            return None
        address = rest[1:end].strip()
    else:
        address = rest.split(" ", 1)[0]
    if address and not email.utils.parseaddr(address)[1]:
        return None
    if any(ord(c) < 32 for c in address):
        return None
    return address


def _read_data(stdin: BinaryIO, limit: int) -> tuple[bytes, bool, bool]:
    """(content, ended with '.', larger than limit); dot-unstuffed, bounded."""
    parts: list[bytes] = []
    total = 0
    too_big = False
    while True:
        line = stdin.readline(65536)
        if not line:
            return b"", False, too_big
        if line in (b".\r\n", b".\n"):
            return b"".join(parts), True, too_big
        if line.startswith(b"."):
            line = line[1:]
        total += len(line)
        if total > limit:
            too_big = True
            parts.clear()
        if not too_big:
            parts.append(line)
