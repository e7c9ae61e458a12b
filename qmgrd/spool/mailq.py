"""``qmgrd mailq``: the queue in Postfix's ``mailq`` / ``postqueue -j`` formats.

Works on the spool directly, like Postfix's showq, so it needs no daemon and
is safe while one runs: files that vanish or are being written meanwhile are
skipped. Mail that ``sendmail`` left in ``maildrop_directory`` and the pickup
has not taken yet is listed too, as showq does, with queue name
``maildrop``: its size is the file's size and its arrival time the file's
mtime (Postfix's showq uses the file size for maildrop files, which have no
size record); its status character is blank. Only recipients not yet done
are listed; a recipient's latest reason in ``defer/ID`` is shown above it
(text) or as ``delay_reason`` (JSON).
Messages are listed oldest first (by the time in the queue id, any format).

Text format: postqueue(1) ``-p``, as Postfix's showq_compat.c prints it
(``"%-11s %7ld %20.20s %s"`` for the id with its status character, the size,
the arrival time and the sender; recipients indented 41 columns; a reason in
parentheses, right-aligned to column 78, above the recipients it applies to,
``(reason unavailable)`` after a reason for recipients that have none)::

    -Queue ID-  --Size-- ----Arrival Time---- -Sender/Recipient-------
    4A0C1922FA60*   1234 Thu Jan  1 00:00:00  sender@example.com
                     (connect to mx.example.com[192.0.2.1]:25: Connection refused)
                                             rcpt@example.com

    -- 1 Kbytes in 1 Request.

With ``enable_long_queue_ids = yes`` the layout is Postfix's long one
(``"%-17s %8ld %19.19s %s"``, headings ``----Queue ID-----`` ...). The status
character after the id: ``*`` active/, ``!`` hold/, ``#`` forced to expire
(``qmgrd.spool.marks``; it wins over the other two, as in Postfix 3.5+),
blank otherwise. The null sender prints as MAILER-DAEMON. The footer counts
message sizes in whole Kbytes, rounded down (``-- 0 Kbytes`` for small mail,
as Postfix); an empty queue prints ``Mail queue is empty``.

JSON (postqueue(1) ``-j``, "JSON OBJECT FORMAT"): one object per message and
line, with exactly Postfix's members in Postfix's order: ``queue_name``,
``queue_id``, ``arrival_time`` (integer seconds), ``message_size`` (integer
bytes of header and body), ``forced_expire`` (true or false), ``sender``
(empty for the null sender), ``recipients`` (a list of ``{"address": ...}``
with ``"delay_reason"`` only when a reason is known).

Addresses and reasons come from outside: the text output escapes their
non-printable characters (``qmgrd.textsafe.printable``: ESC as ``\\x1b``, ...),
and the JSON output writes them as ``\\uHHHH`` escapes
(``printable_json``), which decode to the exact stored value.
"""

from __future__ import annotations

import os
import stat
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from qmgrd.errors import SpoolError
from qmgrd.sendmail.maildrop import MaildropError, read_maildrop_envelope, ready_names
from qmgrd.spool.marks import is_forced_expire
from qmgrd.spool.queueid import is_queue_id, queue_id_sort_key
from qmgrd.spool.store import Spool
from qmgrd.textsafe import printable, printable_json

_LISTED = ("incoming", "active", "deferred", "hold")
_STATUS = {"active": "*", "hold": "!"}
HEADER = "-Queue ID-  --Size-- ----Arrival Time---- -Sender/Recipient-------"
LONG_HEADER = "----Queue ID----- --Size-- ---Arrival Time---- --Sender/Recipient------"


@dataclass(frozen=True, slots=True)
class QueuedMessage:
    """One message as mailq shows it."""

    queue_name: str
    queue_id: str
    arrival_time: float
    message_size: int
    sender: str
    recipients: tuple[tuple[str, str | None], ...]  # (address, delay reason or None)
    forced_expire: bool = False


def scan_queue(
    spool: Spool, now: float | None = None, *, maildrop: Path | None = None
) -> list[QueuedMessage]:
    """Every readable message in the listed queues (and ``maildrop``), oldest first."""
    out = scan_maildrop(maildrop) if maildrop is not None else []
    for queue in _LISTED:
        for queue_id in spool.list_ids(queue):
            try:
                mode = os.lstat(spool.path(queue, queue_id)).st_mode
                qf = spool.open(queue, queue_id)
                recipients = qf.read_all_recipients()
                reasons = {r.address: r.reason for r in spool.read_reasons("defer", queue_id)}
            except (SpoolError, FileNotFoundError):
                continue  # moved, removed or being written meanwhile: showq skips it too
            out.append(
                QueuedMessage(
                    queue,
                    queue_id,
                    qf.arrival_time,
                    qf.content_size,
                    qf.sender,
                    tuple((r.address, reasons.get(r.address)) for r in recipients),
                    is_forced_expire(mode),
                )
            )
    key = queue_id_sort_key(time.time() if now is None else now)
    out.sort(key=lambda m: key(m.queue_id))
    return out


def scan_maildrop(directory: Path) -> list[QueuedMessage]:
    """Submissions waiting in the maildrop directory, as showq lists them (module doc).

    Only complete files named by a queue id; the envelope is read (bounded),
    never the content. Unreadable, vanished or invalid files are skipped, and
    so is a directory the caller may not list (it is the daemon's).
    """
    out: list[QueuedMessage] = []
    try:
        names = ready_names(directory)
    except OSError:  # not ours to list (mode 1730): nothing to show from it
        return out
    for name in names:
        if not is_queue_id(name):
            continue
        try:
            fd = os.open(
                directory / name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
            )
        except OSError:
            continue
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                continue
            message = read_maildrop_envelope(fd)
        except (OSError, MaildropError):
            continue
        finally:
            os.close(fd)
        out.append(
            QueuedMessage(
                "maildrop",
                name,
                st.st_mtime,
                st.st_size,
                message.sender,
                tuple((r, None) for r in message.recipients),
            )
        )
    return out


def format_text(messages: list[QueuedMessage], *, long_ids: bool = False) -> str:
    """Postfix mailq text for ``messages``; ``long_ids`` (enable_long_queue_ids) widens it."""
    if not messages:
        return "Mail queue is empty\n"
    id_width, size_width, time_width = (17, 8, 19) if long_ids else (11, 7, 20)
    indent = " " * (id_width + size_width + time_width + 3)
    lines = [LONG_HEADER if long_ids else HEADER]
    total = 0
    for msg in messages:
        total += msg.message_size
        status = "#" if msg.forced_expire else _STATUS.get(msg.queue_name, " ")
        when = time.asctime(time.localtime(msg.arrival_time))[:time_width]
        lines.append(
            f"{msg.queue_id + status:<{id_width}} {msg.message_size:>{size_width}} "
            f"{when:<{time_width}} {printable(msg.sender) or 'MAILER-DAEMON'}"
        )
        shown = ""
        for address, reason in sorted(msg.recipients, key=lambda r: (r[1] or "", r[0])):
            if (reason or "") != shown:
                shown = reason or ""
                text = printable(shown) if shown else "reason unavailable"
                lines.append(f"{'':{max(0, 76 - len(text))}}({text})")
            lines.append(indent + printable(address))
        lines.append("")
    count = len(messages)
    lines.append(f"-- {total // 1024} Kbytes in {count} Request{'' if count == 1 else 's'}.")
    return "\n".join(lines) + "\n"


def format_json(messages: list[QueuedMessage]) -> str:
    """One ``postqueue -j`` object per line."""
    out = []
    for msg in messages:
        recipients: list[dict[str, str]] = []
        for address, reason in msg.recipients:
            item = {"address": address}
            if reason is not None:
                item["delay_reason"] = reason
            recipients.append(item)
        obj: dict[str, object] = {
            "queue_name": msg.queue_name,
            "queue_id": msg.queue_id,
            "arrival_time": int(msg.arrival_time),
            "message_size": msg.message_size,
            "forced_expire": msg.forced_expire,
            "sender": msg.sender,
            "recipients": recipients,
        }
        out.append(printable_json(obj) + "\n")
    return "".join(out)


def mailq_command(config_dir: Path, *, as_json: bool, out: TextIO) -> int:
    """``qmgrd mailq [--json]``: print the queue; 0 on success."""
    from qmgrd.config import load_config

    cfg = load_config(config_dir, strict=False)  # like the other queue tools (cli.py)
    messages = scan_queue(
        Spool(cfg.get_path("queue_directory")), maildrop=cfg.get_path("maildrop_directory")
    )
    if as_json:
        out.write(format_json(messages))
    else:
        out.write(format_text(messages, long_ids=cfg.get_bool("enable_long_queue_ids")))
    return 0
