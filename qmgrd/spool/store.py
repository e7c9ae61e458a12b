"""The spool directory: queues, durable commit, moves, scans and quarantine.

Layout (DESIGN §3): ``incoming active deferred hold corrupt`` hold queue
files named by queue id; ``defer`` and ``bounce`` hold per-message reason
logs; ``public`` and ``pid`` are for the daemon. Every directory is flat
(no hashing), mode 0700, owned by the daemon's user and not a symlink
(``ensure_dirs`` refuses an unsafe spool; see ``safety``).

Commit protocol (one message, or a batch in ``commit_batch``):

1. write the whole file under a temporary name ``incoming/.<id>`` (a leading
   dot: every scan here ignores such names, so a writer that dies leaves
   nothing the queue manager reads; ``remove_temp_files`` sweeps them at start);
2. fsync the file;
3. ``link`` it to ``incoming/<id>`` (unlike rename, link never replaces an
   existing file) and unlink the temporary name;
4. fsync ``incoming/`` once for the whole batch. Only then is an id returned.

A message that header_checks HOLDs is committed the same way straight into
``hold/`` (step 3 links into ``hold/``, step 4 fsyncs ``hold/``): it is never
visible in ``incoming/``, where a queue scan could take it.

Moves between queues are plain renames without a directory fsync: after a
crash the file is in the old or the new queue, and both are scanned at
start-up, so no message is lost (Postfix does the same).

Foreign entries: scans only return names that look like queue ids, and never
stat through a symlink. ``sweep_foreign`` (start-up, like ``postsuper -s``)
moves whatever else sits in a queue directory (stray names, symlinks, FIFOs,
sub-directories, files owned by another user) to ``corrupt/`` with a warning,
so it can neither be mistaken for mail nor make a scan fail.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Literal

from qmgrd.errors import InvariantError, SpoolError
from qmgrd.log import get_logger
from qmgrd.spool.queueid import QueueIdGenerator, is_queue_id, sort_queue_ids
from qmgrd.spool.reasons import (
    ReasonKind,
    ReasonRecord,
    append_reasons,
    read_reasons,
    remove_reasons,
)
from qmgrd.spool.records import Envelope, QueueFile, encode_queue_file
from qmgrd.spool.safety import check_directory

QueueName = Literal["incoming", "active", "deferred", "hold", "corrupt"]
QUEUES: tuple[QueueName, ...] = ("incoming", "active", "deferred", "hold", "corrupt")
LOG_DIRS = ("defer", "bounce")
DIRECTORIES = (*QUEUES, *LOG_DIRS, "public", "pid")
TEMP_PREFIX = "."
SWEPT_QUEUES: tuple[QueueName, ...] = ("incoming", "active", "deferred", "hold")


class QueueFileMissing(SpoolError, FileNotFoundError):
    """The queue file to move is gone (an operator or another pass moved it meanwhile).

    Both a SpoolError (the module's contract) and a FileNotFoundError, so
    callers can tell "already gone" from "cannot move".
    """


def _check_id(queue_id: str) -> None:
    if not is_queue_id(queue_id):
        raise InvariantError(f"not a queue id: {queue_id!r}")


class Spool:
    """One spool directory tree. Cheap to create; holds no open files.

    ``fsync=False`` skips every fsync (benchmarks and throw-away tests only).
    """

    __slots__ = ("_dirs", "_ids", "fsync", "root")

    def __init__(self, root: Path, *, fsync: bool = True, ids: QueueIdGenerator | None = None):
        self.root = root
        self.fsync = fsync
        self._ids = ids or QueueIdGenerator()
        self._dirs: dict[str, Path] = {}

    # -- layout ----------------------------------------------------------------

    def ensure_dirs(self) -> None:
        """Create missing directories (mode 0700); SpoolError if the spool is unusable or unsafe.

        Every directory must be owned by the daemon's user, must not be a
        symlink (``queue_directory`` itself may be a trusted one) and must not
        be writable by group or others: otherwise the daemon refuses to start
        (``safety``). Mail is private: a directory that is only readable by
        others (a loose umask) is tightened to 0700, with a warning naming it.
        """
        uid = os.geteuid()
        paths = [self.root / name for name in DIRECTORIES]
        # Check every existing directory before anything is created or tightened, so an
        # unsafe spool is refused as it was found.
        if os.path.lexists(self.root):
            check_directory(self.root, uid=uid, tighten=False, is_root=True)
            for path in paths:
                if os.path.lexists(path):
                    check_directory(path, uid=uid, create=False, tighten=False)
        check_directory(self.root, uid=uid, is_root=True)
        for path in paths:
            check_directory(path, uid=uid)

    def path(self, queue: str, queue_id: str) -> Path:
        """Where ``queue_id`` lives (or would live) in ``queue``."""
        _check_id(queue_id)
        return self.root / queue / queue_id

    def queue_dir(self, queue: str) -> Path:
        """The directory of ``queue`` (one Path per queue: a child of it is cheaper to build
        than a Path parsed whole)."""
        found = self._dirs.get(queue)
        if found is None:
            found = self._dirs[queue] = self.root / queue
        return found

    def new_queue_id(self) -> str:
        return self._ids.next()

    # -- scans -----------------------------------------------------------------

    def _entries(self, queue: str) -> Iterator[os.DirEntry[str]]:
        try:
            with os.scandir(self.root / queue) as it:
                for entry in it:
                    if is_queue_id(entry.name):
                        yield entry
        except FileNotFoundError:
            return
        except OSError as exc:
            raise SpoolError(f"cannot list {self.root / queue}: {exc.strerror}") from exc

    def list_ids(self, queue: str) -> list[str]:
        """Queue ids in ``queue``, oldest first; temporary and stray names are ignored.

        Oldest by the time in the id (``sort_queue_ids``): string order is not
        arrival order for Postfix's short ids.
        """
        return sort_queue_ids(e.name for e in self._entries(queue))

    def due_ids(self, queue: str, now: float) -> list[str]:
        """Ids whose file mtime (next-attempt time) is <= now + 1, oldest id first.

        Files are stat()ed, never opened. A file that vanishes meanwhile is skipped.
        """
        out = []
        for entry in self._entries(queue):
            try:
                # Never through a symlink: a dangling one must still be loaded (and quarantined).
                mtime = entry.stat(follow_symlinks=False).st_mtime
            except FileNotFoundError:
                continue
            if mtime <= now + 1:
                out.append(entry.name)
        return sort_queue_ids(out)

    # -- moves -------------------------------------------------------------------

    def move(self, queue_id: str, src: str, dst: str, *, mtime: float | None = None) -> Path:
        """Rename a queue file to another queue; set its atime/mtime first if given."""
        return Path(self.rename(queue_id, src, dst, mtime=mtime))

    def rename(self, queue_id: str, src: str, dst: str, *, mtime: float | None = None) -> str:
        """``move``, returning the new name as a string (no ``Path`` is built: a pathlib
        construction costs more instructions than the rename's own Python)."""
        _check_id(queue_id)
        # Plain strings for the system calls: a pathlib join costs more than the rename
        # (every message is moved at least once, in a worker thread holding the GIL).
        src_name = f"{self.root}/{src}/{queue_id}"
        dst_name = f"{self.root}/{dst}/{queue_id}"
        try:
            if mtime is not None:
                os.utime(src_name, (mtime, mtime), follow_symlinks=False)
            os.rename(src_name, dst_name)
        except FileNotFoundError as exc:
            raise QueueFileMissing(
                f"cannot move {queue_id} from {src} to {dst}: {exc.strerror}"
            ) from exc
        except OSError as exc:
            raise SpoolError(f"cannot move {queue_id} from {src} to {dst}: {exc.strerror}") from exc
        return dst_name

    def remove(self, queue: str, queue_id: str) -> bool:
        """Delete a queue file; False if it was already gone."""
        _check_id(queue_id)
        try:
            os.unlink(f"{self.root}/{queue}/{queue_id}")
        except FileNotFoundError:
            return False
        except OSError as exc:
            raise SpoolError(f"cannot remove {queue}/{queue_id}: {exc.strerror}") from exc
        return True

    def quarantine(self, queue: str, queue_id: str, reason: str) -> Path:
        """Move an unusable file to corrupt/ and say so in the log."""
        dst = self.move(queue_id, queue, "corrupt")
        get_logger("qmgr").warning(
            "corrupt queue file", queue_id=queue_id, file=f"{queue}/{queue_id}", reason=reason
        )
        return dst

    def remove_temp_files(self, only: Callable[[str], bool] | None = None) -> int:
        """Delete leftovers of writers that died before their commit; call at start-up only.

        With ``only`` (a predicate on the queue id), just those temporaries: a dead
        listener worker's, whose queue id slot no live writer draws from.
        """
        removed = 0
        directory = self.root / "incoming"
        try:
            with os.scandir(directory) as it:
                names = [e.name for e in it if e.name.startswith(TEMP_PREFIX)]
        except OSError as exc:
            raise SpoolError(f"cannot clean {directory}: {exc.strerror}") from exc
        if only is not None:
            names = [n for n in names if _temp_of(n, only)]
        for name in names:
            try:
                os.unlink(directory / name)
                removed += 1
            except FileNotFoundError:
                continue
            except OSError as exc:  # a directory or an immutable file: not ours, leave it
                get_logger("qmgr").warning(
                    "cannot remove stray temporary file",
                    file=f"incoming/{name}",
                    error=exc.strerror or str(exc),
                )
        return removed

    def sweep_foreign(
        self, queues: Sequence[QueueName] = SWEPT_QUEUES, *, logs: bool = True
    ) -> int:
        """Move entries that are not plain queue files out of ``queues`` into corrupt/.

        Start-up only; see :func:`qmgrd.spool.sweep.sweep_foreign`.
        """
        from qmgrd.spool.sweep import sweep_foreign  # here: sweep imports this module

        return sweep_foreign(self, queues, logs=logs)

    # -- files -------------------------------------------------------------------

    def open(self, queue: str, queue_id: str) -> QueueFile:
        """Parse a queue file's envelope (SpoolError if it is unusable)."""
        return QueueFile.open(self.path(queue, queue_id))

    def append_reasons(
        self, kind: ReasonKind, queue_id: str, records: Sequence[ReasonRecord]
    ) -> None:
        """Durably append defer/bounce reasons for a message (see ``reasons``)."""
        append_reasons(self.root, kind, queue_id, records, fsync=self.fsync)

    def read_reasons(self, kind: ReasonKind, queue_id: str) -> list[ReasonRecord]:
        return read_reasons(self.root, kind, queue_id)

    def remove_reasons(self, kind: ReasonKind, queue_id: str) -> bool:
        return remove_reasons(self.root, kind, queue_id)

    # -- commit ------------------------------------------------------------------

    def commit(
        self,
        envelope: Envelope,
        content: bytes,
        *,
        queue_id: str | None = None,
        queue: QueueName = "incoming",
    ) -> str:
        """Durably store one message in incoming/ and return its id (see the module doc).

        ``queue_id``: store under this id (the pickup uses the maildrop file's
        name); a file of that name already in incoming/ is a SpoolError.
        ``queue="hold"``: the file is linked straight into hold/ (header_checks
        HOLD), with the same fsyncs; it never appears in incoming/.
        """
        result = self.commit_batch([(envelope, content)], queue_id=queue_id, queue=queue)[0]
        if isinstance(result, BaseException):
            raise result
        return result

    def commit_batch(
        self,
        items: Sequence[tuple[Envelope, bytes]],
        *,
        queue_id: str | None = None,
        queue: QueueName = "incoming",
    ) -> list[str | SpoolError]:
        """Store several messages with one directory fsync; a result (id or error) per item.

        A failure affects only its own item, except a failed directory fsync,
        which fails (and unlinks) every item of the batch: none of them was
        acknowledged, so none may stay where the queue manager would find it.
        """
        directory = self.root / queue
        results: list[str | SpoolError] = []
        for envelope, content in items:
            try:
                results.append(self._write_one(directory, envelope, content, queue_id))
            except OSError as exc:
                results.append(SpoolError(f"queue file write error: {exc.strerror or exc}"))
        committed = [r for r in results if isinstance(r, str)]
        if committed and self.fsync:
            try:
                self._fsync_dir(directory)
            except OSError as exc:
                for queue_id in committed:
                    with contextlib.suppress(OSError):
                        os.unlink(directory / queue_id)
                error = SpoolError(f"queue directory sync error: {exc.strerror or exc}")
                return [error for _ in results]
        return results

    def _write_one(
        self, directory: Path, envelope: Envelope, content: bytes, fixed: str | None = None
    ) -> str:
        head, tail = encode_queue_file(envelope, len(content))
        queue_id = fixed or self._ids.next()
        temp = self.root / "incoming" / (TEMP_PREFIX + queue_id)  # swept at start-up
        # O_EXCL: ids never repeat within a generator, so EEXIST here is an error to report.
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        try:
            try:
                _write_all(fd, [head, content, tail])
                if self.fsync:
                    os.fsync(fd)
            finally:
                os.close(fd)
            try:
                os.link(temp, directory / queue_id)
            except FileExistsError:
                if fixed:  # the caller's id is taken: report it, never rename
                    raise
                # A salt collision with another process: keep the data, pick a new name.
                queue_id = self._ids.next()
                os.link(temp, directory / queue_id)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(temp)
            raise
        os.unlink(temp)
        return queue_id

    @staticmethod
    def _fsync_dir(directory: Path) -> None:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _write_all(fd: int, parts: list[bytes]) -> None:
    """writev until every byte is written (short writes happen on full disks and signals)."""
    views = [memoryview(p) for p in parts if p]
    while views:
        written = os.writev(fd, views)
        if written == 0:
            raise OSError(f"write returned 0 with {sum(len(v) for v in views)} bytes left")
        while views and written >= len(views[0]):
            written -= len(views[0])
            views.pop(0)
        if views and written:
            views[0] = views[0][written:]


def _temp_of(name: str, only: Callable[[str], bool]) -> bool:
    """Whether temporary ``name`` holds a queue id that ``only`` accepts."""
    try:
        return only(name[len(TEMP_PREFIX) :])
    except ValueError:  # not a queue id: no writer of ours made it
        return False
