"""The spool: queue directories, queue ids, queue files and their durable commit.

Public API (the engine, the agents, the listener and the CLI use only this):

Layout and moves — ``Spool(root: Path, *, fsync: bool = True)``
    ``ensure_dirs() -> None``: incoming active deferred hold corrupt defer bounce
    public pid, mode 0700, flat (no hashing); SpoolError (refuse to start) when a
    spool directory is owned by another user, group/world-writable or a symlink
    (``qmgrd.spool.safety``).
    ``path(queue, queue_id) -> Path``.
    ``move(queue_id, src, dst, *, mtime: float | None = None) -> Path``: rename;
    ``mtime`` (the next-attempt time of a deferred file) is set before the rename.
    ``list_ids(queue) -> list[str]``: oldest first (``sort_queue_ids``); ``due_ids(queue, now)
    -> list[str]``: files with mtime <= now + 1, never opened.
    ``remove(queue, queue_id) -> bool``; ``quarantine(queue, queue_id, reason) -> Path``
    (to corrupt/, logs ``warning: ID: corrupt queue file, file=..., reason=...``).
    ``remove_temp_files() -> int``: start-up sweep of dead writers' temporaries.
    ``open(queue, queue_id) -> QueueFile``.
    ``append_reasons(kind, queue_id, records)``, ``read_reasons(kind, queue_id)``,
    ``remove_reasons(kind, queue_id) -> bool`` with kind "defer" | "bounce".

Queue ids — ``QueueIdGenerator(long_ids=False).next()``, ``new_queue_id()``,
    ``is_queue_id(name)``, ``queue_id_time(id)``, ``sort_queue_ids(ids)``: Postfix's
    short (12 hex chars, default) or long (``enable_long_queue_ids``) format; readers
    accept both and the legacy 15-char ids (``qmgrd.spool.queueid``).

Marks — ``mark_forced_expire(path)``, ``is_forced_expire(st_mode)``: "forced to
    expire" is the queue file's group-execute bit, as in Postfix (``qmgrd.spool.marks``).

Writing — ``Envelope(sender, recipients: tuple[RecipientSpec, ...], arrival_time,
    envid, ret, smtputf8, body, client_name, client_addr, helo, warn_time)``,
    ``RecipientSpec(address, orcpt=None, notify=frozenset())``.
    ``Spool.commit(envelope, content: bytes) -> str`` (sync, durable) and
    ``Spool.commit_batch(items) -> list[str | SpoolError]``.
    ``GroupCommitter(spool).commit(envelope, content) -> Awaitable[str]`` (async, one
    directory fsync per batch of concurrent sessions; ``close()`` drains it).
    Temporary names start with "." in incoming/; every scan ignores them.

Reading — ``QueueFile.open(path) -> QueueFile`` (SpoolError with the reason if the
    file cannot be parsed; its subclass ``QueueFileIOError`` when the system failed
    (EMFILE, EIO, EACCES...): the file may be fine, do not quarantine it, retry):
    sender, arrival_time, rcpt_count, content_offset, content_size,
    first_recipient_offset, envid, ret, smtputf8, body, client_name, client_addr, helo,
    warn_time, warn_offset.
    ``QueueFile.read_recipients(offset, limit) -> (list[RecipientRecord], next_offset)``
    (next_offset 0 = no recipient left; D records skipped; memory bounded by limit).
    ``RecipientRecord(address, offset, orcpt, notify)``; offset = its R type byte.

In-place writes (call from a worker thread) — ``mark_done(path, offsets)``: R -> D, one
    open, one fsync. ``rewrite_warn_time(path, warn_offset, value)`` (``WARNED`` = -1).

Content — ``QueueFileContent(path, offset, size)`` / ``QueueFileContent.of(qf)``: a
    ``ContentSource`` (async ``chunks()`` read off the loop); ``read_content(path)``.

Lock — ``qmgrd.spool.lock``: ``lock_spool(root)`` (the daemon's exclusive flock on
    pid/master.pid, taken before any spool change), ``lock_spool_shared(root)`` (offline
    operator commands; ``DaemonHoldsSpool`` when a daemon runs).

mailq — ``qmgrd.spool.mailq.mailq_command(config_dir, *, as_json, out) -> int``.
"""

from qmgrd.spool.commit import GroupCommitter
from qmgrd.spool.content import QueueFileContent, read_content
from qmgrd.spool.marks import is_forced_expire, mark_forced_expire
from qmgrd.spool.queueid import (
    QueueIdGenerator,
    is_queue_id,
    new_queue_id,
    queue_id_time,
    sort_queue_ids,
)
from qmgrd.spool.reasons import ReasonKind, ReasonRecord
from qmgrd.spool.records import (
    WARNED,
    Envelope,
    QueueFile,
    QueueFileIOError,
    RecipientRecord,
    RecipientSpec,
    mark_done,
    read_recipients,
    rewrite_warn_time,
)
from qmgrd.spool.store import DIRECTORIES, QUEUES, QueueName, Spool

__all__ = [
    "DIRECTORIES",
    "QUEUES",
    "WARNED",
    "Envelope",
    "GroupCommitter",
    "QueueFile",
    "QueueFileContent",
    "QueueFileIOError",
    "QueueIdGenerator",
    "QueueName",
    "ReasonKind",
    "ReasonRecord",
    "RecipientRecord",
    "RecipientSpec",
    "Spool",
    "is_forced_expire",
    "is_queue_id",
    "mark_done",
    "mark_forced_expire",
    "new_queue_id",
    "queue_id_time",
    "read_content",
    "read_recipients",
    "rewrite_warn_time",
    "sort_queue_ids",
]
