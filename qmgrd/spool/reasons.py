"""Per-message defer and bounce reason logs (``defer/ID``, ``bounce/ID``; DESIGN §3).

The engine appends one record per recipient outcome it must remember:
``defer`` collects the reasons of the current delivery pass (shown by mailq,
used by delay warnings), ``bounce`` the hard failures that a DSN will report.
A recipient is marked done in its queue file only after its bounce record
is durable, so a crash can repeat a bounce line but never lose one.

Format: JSON lines, appended with ``O_APPEND`` and fsynced (plus a directory
fsync when the file is new). An append is all or nothing: after a short or
failed write (a full disk) or a failed fsync the file is truncated back to
its old size, and an append to a file that ends in a torn line (a crash
mid-append) starts on a new line, so a retried append is never glued to a
torn one (issue 9, item 7). A torn last line is ignored by the reader, and
so is (with a warning) any other malformed line: one damaged record must not
keep its message out of the active queue forever; a complete record glued
after a torn one (logs from older versions) is still recovered. The log is
opened without following symlinks and must be a regular file.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

from qmgrd.errors import InvariantError, SpoolError
from qmgrd.log import get_logger
from qmgrd.spool.queueid import is_queue_id
from qmgrd.spool.records import open_regular

ReasonKind = Literal["defer", "bounce"]
_RECORD_START = b'{"address":'
Action = Literal["delayed", "failed"]


@dataclass(frozen=True, slots=True)
class ReasonRecord:
    """Why one recipient was deferred or bounced."""

    address: str
    dsn: str  # enhanced status code, e.g. "4.4.1"
    action: Action
    reason: str  # remote reply or local explanation
    time: float  # when it happened (seconds since the epoch)
    relay: str = "none"
    orcpt: str | None = None
    notify: tuple[str, ...] = ()  # DSN NOTIFY keywords of the recipient; () = not given


def _path(root: Path, kind: ReasonKind, queue_id: str) -> Path:
    _check(kind, queue_id)
    return root / kind / queue_id


def _check(kind: ReasonKind, queue_id: str) -> None:
    if kind not in ("defer", "bounce") or not is_queue_id(queue_id):
        raise InvariantError(f"bad reason log {kind!r}/{queue_id!r}")


def append_reasons(
    root: Path,
    kind: ReasonKind,
    queue_id: str,
    records: Iterable[ReasonRecord],
    *,
    fsync: bool = True,
) -> None:
    """Durably append records to the message's ``kind`` log (created if missing)."""
    path = _path(root, kind, queue_id)
    data = b"".join(
        json.dumps(asdict(r), ensure_ascii=False, separators=(",", ":")).encode(
            "utf-8", "surrogateescape"
        )
        + b"\n"
        for r in records
    )
    if not data:
        return
    try:
        created = not path.exists()
        fd = open_regular(path, os.O_RDWR | os.O_APPEND | os.O_CREAT)
        try:
            _append(fd, data, fsync=fsync)
        finally:
            os.close(fd)
        if created and fsync:
            dfd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)
    except OSError as exc:
        raise SpoolError(f"cannot write {kind} log {queue_id}: {exc.strerror or exc}") from exc


def _append(fd: int, data: bytes, *, fsync: bool) -> None:
    """Append ``data`` whole or not at all (as far as a reader can tell).

    The size before the append is remembered; after a short or failed write
    (ENOSPC, EIO) or a failed fsync the file is truncated back to it, so the
    caller's retry starts on a clean line instead of being glued to a torn
    one. If the file already ends in a torn line (a crash mid-append, or a
    truncate that failed too), a newline is written first: the torn line
    stays malformed on its own and cannot swallow the records that follow.
    """
    size = os.fstat(fd).st_size
    if size and os.pread(fd, 1, size - 1) != b"\n":
        data = b"\n" + data
    view = memoryview(data)
    try:
        while view:
            written = os.write(fd, view)
            if written <= 0:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            view = view[written:]
        if fsync:
            os.fsync(fd)
    except OSError:
        with contextlib.suppress(OSError):
            os.ftruncate(fd, size)
        raise


def read_reasons(root: Path, kind: ReasonKind, queue_id: str) -> list[ReasonRecord]:
    """Every complete record of the message's ``kind`` log, in order; [] if none."""
    path = _path(root, kind, queue_id)
    try:
        with os.fdopen(open_regular(path, os.O_RDONLY), "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise SpoolError(f"cannot read {kind} log {queue_id}: {exc.strerror}") from exc
    out = []
    lines = data.split(b"\n")
    for number, line in enumerate(lines[:-1], 1):  # the part after the last \n is torn
        try:
            out.append(_decode(line))
        except (ValueError, TypeError) as exc:
            glued = _resync(line)
            if glued is not None:
                out.append(glued)
            get_logger("qmgr").warning(
                "malformed reason record skipped",
                queue_id=queue_id,
                file=f"{kind}/{queue_id}",
                line=number,
                error=str(exc),
                recovered="a record appended after it" if glued is not None else "none",
            )
    return out


def _resync(line: bytes) -> ReasonRecord | None:
    """The complete record glued after a torn one on the same line, if there is one.

    Logs written before appends were made all-or-nothing can hold a torn
    record with the retried one glued to it; every record starts with
    ``{"address":`` (``asdict`` keeps field order), so the last such start is
    tried on its own.
    """
    start = line.rfind(_RECORD_START)
    if start <= 0:
        return None
    try:
        return _decode(line[start:])
    except (ValueError, TypeError):
        return None


def _decode(line: bytes) -> ReasonRecord:
    """One JSON line as a ReasonRecord; ValueError/TypeError if its shape or types are wrong."""
    obj = json.loads(line.decode("utf-8", "surrogateescape"))
    if not isinstance(obj, dict):
        raise TypeError("not a JSON object")
    notify = obj.pop("notify", [])
    if not isinstance(notify, list) or not all(isinstance(word, str) for word in notify):
        raise TypeError("notify is not a list of strings")
    record = ReasonRecord(**obj, notify=tuple(notify))
    for name in ("address", "dsn", "action", "reason", "relay"):
        if not isinstance(getattr(record, name), str):
            raise TypeError(f"{name} is not a string")
    if record.orcpt is not None and not isinstance(record.orcpt, str):
        raise TypeError("orcpt is not a string")
    if isinstance(record.time, bool) or not isinstance(record.time, int | float):
        raise TypeError("time is not a number")
    if not 0 <= record.time < 1e11:  # also NaN and inf: datetime would choke on them later
        raise ValueError(f"time {record.time!r} out of range")
    if record.action not in ("delayed", "failed"):
        raise ValueError(f"bad action {record.action!r}")
    return record


def remove_reasons(root: Path, kind: ReasonKind, queue_id: str) -> bool:
    """Delete the message's ``kind`` log; False if there was none."""
    _check(kind, queue_id)  # the unlink takes a plain string: cheaper than a pathlib join
    try:
        os.unlink(f"{root}/{kind}/{queue_id}")
    except FileNotFoundError:
        return False
    except OSError as exc:
        raise SpoolError(f"cannot remove {kind} log {queue_id}: {exc.strerror}") from exc
    return True
