"""``qmgrd hold|release|delete|requeue ID...|ALL|-``: postsuper, safe beside the daemon.

Theory of operation
-------------------
The spool must never have two writers for one message. When the daemon runs,
every operation therefore goes through its control socket: the engine moves
or removes messages that wait in a queue; for a message that is being
delivered it writes the operation to disk at once (a restart honours it),
starts no new delivery of it and completes the operation when its current
pass ends (result ``pending``). Only when no daemon answers does this module
touch the spool itself (through ``qmgrd.ops.spoolops``, the file side the
daemon uses too), as Postfix's postsuper does:

=========  ==========================================  ==========================
operation  from                                        to
=========  ==========================================  ==========================
hold       incoming, active, deferred                  hold/
release    hold                                        deferred/, mtime now (due)
delete     incoming, active, deferred, hold            removed, with defer/ and
                                                       bounce/ logs
requeue    incoming, active, deferred, hold            incoming/, mtime now
=========  ==========================================  ==========================

``active/`` is only listed here for a stopped daemon: its files are what a
crash left behind and the next start moves them to ``incoming/``, so they are
treated like incoming ones. ``requeue`` sends a message through the feed
again, where its recipients are resolved with the configuration of the
daemon that picks it up.

``offline_operate(spool, op, queue_ids, now) -> dict[str, str]`` is the spool
side; ``operate_command(...)`` is the CLI command: it reads ids (``-`` = from
stdin), talks to the daemon or falls back to ``offline_operate``, prints a
postsuper-style summary (``qmgrd: Deleted: 3 messages``) and returns the exit
code (0 done, 1 some id not found or failed, 2 bad arguments). Results the
daemon or the file system wrote (error texts) are printed through
``qmgrd.textsafe.printable``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TextIO

from qmgrd.daemon.control import MAX_IDS, control_socket_path
from qmgrd.errors import SpoolError
from qmgrd.ops.client import DaemonNotRunning, call
from qmgrd.ops.operation import Operation, OpResult
from qmgrd.ops.spoolops import operate_file
from qmgrd.spool import Spool, is_queue_id
from qmgrd.spool.lock import DaemonHoldsSpool, lock_spool_shared
from qmgrd.textsafe import printable

__all__ = ["UsageError", "offline_operate", "operate_command", "parse_ids", "parse_selection"]


class UsageError(ValueError):
    """Bad command arguments (exit code 2)."""


def parse_ids(args: Sequence[str], stdin: TextIO) -> list[str] | None:
    """The queue ids named by ``args``: None for ALL; ``-`` reads whitespace-separated ids.

    Ids copied from mailq output may carry its status mark (``*`` active,
    ``!`` hold); it is stripped, as the usual ``mailq | ... | postsuper -d -``
    pipelines expect.
    """
    if "ALL" in args:
        if len(args) != 1:
            raise UsageError("ALL cannot be combined with queue ids")
        return None
    ids: list[str] = []
    for arg in args:
        words: Iterable[str] = stdin.read().split() if arg == "-" else [arg]
        for word in words:
            queue_id = word.rstrip("*!")
            if not is_queue_id(queue_id):
                raise UsageError(f"invalid queue id: {word!r}")
            ids.append(queue_id)
    return list(dict.fromkeys(ids))


def parse_selection(
    op: Operation, args: Sequence[str], stdin: TextIO
) -> tuple[list[str] | None, str | None]:
    """``(ids, None)``, ``(None, None)`` for ALL, or ``(None, QUEUE)`` for ``ALL QUEUE``.

    ``ALL QUEUE`` is postsuper's ``-d ALL deferred``: every message of one queue;
    the queue must be one the operation takes messages from (``op.sources``).
    """
    if len(args) == 2 and args[0] == "ALL" and args[1] != "ALL" and not is_queue_id(args[1]):
        queue = args[1]
        if queue not in op.sources:
            raise UsageError(
                f"{op.value} ALL takes a queue name among {', '.join(op.sources)}, not {queue!r}"
            )
        return None, queue
    return parse_ids(args, stdin), None


def offline_operate(
    spool: Spool,
    op: Operation,
    queue_ids: Sequence[str] | None,
    now: float,
    *,
    queue: str | None = None,
) -> dict[str, str]:
    """Apply ``op`` directly to the spool (no daemon running); a result per id.

    Results are ``ok``, ``not found`` or ``error: ...`` (``OpResult``). ALL
    means every message in the operation's source queues (for ``hold``, those
    not held yet), or only in ``queue`` when it is given. The file side is
    ``qmgrd.ops.spoolops``, shared with the daemon.
    """
    op = Operation(op)
    sources = op.sources if queue is None else (queue,)
    if queue_ids is None:
        listed = op.all_sources if queue is None else (queue,)
        queue_ids = sorted({q for src in listed for q in spool.list_ids(src)})
    return {q: operate_file(spool, op, q, sources, now) for q in queue_ids}


def operate_command(
    queue_directory: Path,
    op: Operation | str,
    args: Sequence[str],
    *,
    stdin: TextIO,
    out: TextIO,
    err: TextIO,
    now: float,
    release: bool = False,
) -> int:
    """The CLI command (see the module doc); returns the exit code.

    ``release`` (``expire -f``, postsuper's ``-f``): the expired messages that are on hold
    are released as well, so they are returned now.

    ``op`` may be the sub-command's name as argparse gives it: it is parsed here,
    at the edge, into an ``Operation``.
    """
    try:
        op = Operation.parse(op)
        queue_ids, queue = parse_selection(op, args, stdin)
    except ValueError as exc:  # UsageError, or an unknown operation
        err.write(f"qmgrd: fatal: {exc}\n")
        return 2
    if queue_ids == []:
        err.write("qmgrd: warning: no queue ids given\n")
        return 0
    results = _operate(queue_directory, op, queue_ids, queue, now, err)
    if results is None:
        return 1
    code = _report(op, results, out=out, err=err)
    if release and op is Operation.EXPIRE and queue in (None, "hold"):
        # postsuper -f: the expired messages that are held are released too (returned now).
        ids = None if queue_ids is None else [q for q, r in results.items() if r == OpResult.OK]
        if ids != []:
            released = _operate(queue_directory, Operation.RELEASE, ids, queue, now, err)
            if released is None:
                return 1
            count = sum(1 for r in released.values() if r == OpResult.OK)
            if count:
                plural = "" if count == 1 else "s"
                out.write(f"qmgrd: {Operation.RELEASE.summary}: {count} message{plural}\n")
    return code


def _operate(
    queue_directory: Path,
    op: Operation,
    queue_ids: list[str] | None,
    queue: str | None,
    now: float,
    err: TextIO,
) -> dict[str, str] | None:
    """Results from the daemon, or offline under the shared lock; None (said on ``err``) when
    a daemon holds the spool but does not answer yet."""
    results = _via_daemon(queue_directory, op, queue_ids, queue)
    if results is not None:
        return results
    try:
        with lock_spool_shared(queue_directory):
            return offline_operate(Spool(queue_directory), op, queue_ids, now, queue=queue)
    except DaemonHoldsSpool as exc:  # a daemon took the spool since it did not answer
        results = _via_daemon(queue_directory, op, queue_ids, queue)
        if results is None:
            pid = "unknown" if exc.pid is None else exc.pid
            err.write(f"qmgrd: fatal: the daemon (pid {pid}) is starting; try again\n")
        return results


def _via_daemon(
    queue_directory: Path, op: Operation, queue_ids: list[str] | None, queue: str | None
) -> dict[str, str] | None:
    """Results from the daemon, or None when no daemon runs."""
    path = control_socket_path(queue_directory)
    batches: list[list[str] | None] = (
        [None] if queue_ids is None
        else [queue_ids[i : i + MAX_IDS] for i in range(0, len(queue_ids), MAX_IDS)]
    )
    results: dict[str, str] = {}
    for number, batch in enumerate(batches):
        try:
            request: dict[str, object] = {"op": op.value, "ids": batch or "ALL"}
            if queue is not None:
                request["queue"] = queue
            reply = call(path, request)
        except DaemonNotRunning:
            if number == 0:
                return None
            raise  # the daemon stopped between batches: its message is the truth
        got = reply.get("results")
        if not isinstance(got, dict):
            raise SpoolError(f"unexpected reply from the daemon: {reply!r}")
        results.update({str(k): str(v) for k, v in got.items()})
    return results


def _report(op: Operation, results: dict[str, str], *, out: TextIO, err: TextIO) -> int:
    done = pending = 0
    failed = False
    for queue_id, result in results.items():
        if result == OpResult.OK:
            done += 1
        elif result == OpResult.PENDING:
            pending += 1
        elif result == OpResult.NOT_FOUND:
            err.write(f"qmgrd: warning: {printable(queue_id)}: no such message\n")
            failed = True
        else:
            err.write(f"qmgrd: warning: {printable(queue_id)}: {printable(result)}\n")
            failed = True
    count = done + pending
    line = f"qmgrd: {op.summary}: {count} message{'' if count == 1 else 's'}"
    if pending:
        line += f" ({pending} when {'its' if pending == 1 else 'their'} delivery ends)"
    out.write(line + "\n")
    return 1 if failed else 0
