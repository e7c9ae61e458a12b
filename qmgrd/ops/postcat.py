"""``qmgrd cat ID``: show one queued message, as Postfix's ``postcat -q ID`` does.

Output (all sections, the default)::

    *** ENVELOPE RECORDS deferred/3F9A2B0C1D ***
    message_size:             332             240               2               0
    message_arrival_time: Mon Nov 23 08:00:00 2026
    named_attribute: envid=...            (one line per stored attribute)
    sender: a@example.com
    original_recipient: rfc822;b@example.net
    notify_flags: SUCCESS,FAILURE
    recipient: b@example.net              (recipients still to deliver; done ones are
                                           not shown: the spool API does not expose them)
    *** MESSAGE CONTENTS deferred/3F9A2B0C1D ***
    Received: ...
    (headers)

    (body)
    *** MESSAGE FILE END deferred/3F9A2B0C1D ***

``-e`` / ``-h`` / ``-b`` select the envelope, the header or the body (any
combination); with a selection only those lines are printed, without the
``***`` markers, so ``qmgrd cat -b ID | ...`` gives the body alone. The
message is looked for in every queue (incoming, active, deferred, hold,
corrupt). Every line is escaped for the terminal: control characters and
invalid UTF-8 become ``\\xNN`` (tabs stay), so a hostile message cannot
drive the operator's terminal. The content is read in chunks (a large
message is never held in memory whole). Exit 0, or 1 with
``qmgrd: fatal: ...`` when the id is malformed or not queued.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TextIO

from qmgrd.errors import SpoolError
from qmgrd.spool.queueid import is_queue_id
from qmgrd.spool.records import QueueFile, open_regular
from qmgrd.spool.store import QUEUES, Spool

_CHUNK = 65536


def show(line: bytes) -> str:
    """One line for the terminal: UTF-8 decoded, everything non-printable escaped."""
    text = line.decode("utf-8", "backslashreplace")
    if text.isprintable():
        return text
    return "".join(
        ch
        if ch.isprintable() or ch == "\t"
        else (f"\\x{ord(ch):02x}" if ord(ch) < 256 else f"\\u{ord(ch):04x}")
        for ch in text
    )


def _content_lines(qf: QueueFile) -> Iterator[bytes]:
    """The content's lines without their line ends, read in chunks."""
    fd = open_regular(qf.path, os.O_RDONLY)
    try:
        pos, end = qf.content_offset, qf.content_offset + qf.content_size
        pending = b""
        while pos < end:
            data = os.pread(fd, min(_CHUNK, end - pos), pos)
            if not data:
                raise SpoolError(f"{qf.path}: content ends early at offset {pos}")
            pos += len(data)
            pending += data
            *lines, pending = pending.split(b"\n")
            for line in lines:
                yield line.removesuffix(b"\r")
        if pending:
            yield pending.removesuffix(b"\r")
    finally:
        os.close(fd)


def _envelope(qf: QueueFile) -> Iterator[str]:
    yield (
        f"message_size: {qf.content_size:>15} {qf.content_offset:>15} "
        f"{qf.rcpt_count:>15} {qf.flags:>15}"
    )
    yield f"message_arrival_time: {time.asctime(time.localtime(qf.arrival_time))}"
    for name in ("envid", "ret", "body", "client_name", "client_addr", "helo"):
        value = getattr(qf, name)
        if value is not None:
            yield f"named_attribute: {name}={show(str(value).encode())}"
    if qf.smtputf8:
        yield "named_attribute: smtputf8=yes"
    if qf.warn_time is not None and qf.warn_time >= 0:
        yield f"delay_warning_time: {time.asctime(time.localtime(qf.warn_time))}"
    yield f"sender: {show(qf.sender.encode('utf-8', 'surrogateescape'))}"
    for rcpt in qf.read_all_recipients():
        if rcpt.orcpt is not None:
            yield f"original_recipient: {show(rcpt.orcpt.encode('utf-8', 'surrogateescape'))}"
        if rcpt.notify:
            yield f"notify_flags: {','.join(sorted(rcpt.notify))}"
        yield f"recipient: {show(rcpt.address.encode('utf-8', 'surrogateescape'))}"


def find_message(spool: Spool, queue_id: str) -> tuple[str, QueueFile] | None:
    """(queue, parsed file) of ``queue_id``, or None if it is in no queue."""
    for queue in QUEUES:
        path = spool.path(queue, queue_id)
        if path.exists():
            return queue, QueueFile.open(path)
    return None


def cat_command(
    queue_directory: Path,
    queue_id: str,
    *,
    envelope: bool,
    header: bool,
    body: bool,
    out: TextIO,
    err: TextIO,
) -> int:
    """Print one queued message (module doc); 0, or 1 with a message on ``err``."""
    if not is_queue_id(queue_id):
        print(f"qmgrd: fatal: invalid queue id: {show(queue_id.encode())}", file=err)
        return 1
    if not queue_directory.is_dir():
        print(f"qmgrd: fatal: queue directory {queue_directory} does not exist", file=err)
        return 1
    found = find_message(Spool(queue_directory), queue_id)
    if found is None:
        print(f"qmgrd: fatal: message {queue_id} is not in the queue", file=err)
        return 1
    queue, qf = found
    try:
        _print_message(qf, f"{queue}/{queue_id}", envelope, header, body, out)
    except BrokenPipeError:
        raise  # the reader went away: the CLI ends quietly
    except OSError as exc:  # removed or moved while being read
        print(f"qmgrd: fatal: {qf.path}: cannot read: {exc.strerror or exc}", file=err)
        return 1
    return 0


def _print_message(
    qf: QueueFile, name: str, envelope: bool, header: bool, body: bool, out: TextIO
) -> None:
    everything = not (envelope or header or body)
    if everything:
        print(f"*** ENVELOPE RECORDS {name} ***", file=out)
    if everything or envelope:
        for line in _envelope(qf):
            print(line, file=out)
    if everything:
        print(f"*** MESSAGE CONTENTS {name} ***", file=out)
    if everything or header or body:
        in_header = True
        for raw in _content_lines(qf):
            if in_header and not raw:
                in_header = False
                if everything or (header and body):
                    print("", file=out)
                continue
            if (in_header and (everything or header)) or (not in_header and (everything or body)):
                print(show(raw), file=out)
    if everything:
        print(f"*** MESSAGE FILE END {name} ***", file=out)
