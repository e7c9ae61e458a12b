"""Offline postsuper under the spool's shared lock, its retry of a starting daemon, safe output."""

from __future__ import annotations

import io
import os
from collections.abc import Sequence

import pytest

from qmgrd.errors import SpoolError
from qmgrd.ops import postsuper
from qmgrd.ops.operation import Operation
from qmgrd.ops.postsuper import operate_command
from qmgrd.spool import Envelope, RecipientSpec, Spool
from qmgrd.spool.lock import SpoolBusy, lock_spool

NOW = 1_700_000_000.0


def _commit(spool: Spool) -> str:
    return spool.commit(Envelope("s@x.test", (RecipientSpec("r@y.test"),), NOW - 100), b"x")


def _run(spool: Spool, op: str, args: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = operate_command(
        spool.root, op, args, stdin=io.StringIO(), out=out, err=err, now=NOW
    )
    return code, out.getvalue(), err.getvalue()


def test_offline_operation_holds_the_shared_lock(
    spool: Spool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While the offline path changes the spool, a daemon cannot take the spool's lock."""
    qid = _commit(spool)
    seen: list[str] = []
    real = postsuper.offline_operate

    def watching(
        s: Spool, op: Operation, ids: Sequence[str] | None, now: float, *, queue: str | None = None
    ) -> dict[str, str]:
        with pytest.raises(SpoolBusy, match="locked by offline qmgrd commands"):
            lock_spool(spool.root, wait=0, sleep=lambda _: None)
        seen.append("checked")
        return real(s, op, ids, now, queue=queue)

    monkeypatch.setattr(postsuper, "offline_operate", watching)
    assert _run(spool, "hold", [qid]) == (0, "qmgrd: Placed on hold: 1 message\n", "")
    assert seen == ["checked"]
    assert spool.path("hold", qid).exists()
    with lock_spool(spool.root, wait=0):  # released afterwards
        pass


def test_a_starting_daemon_is_asked_again_then_reported(spool: Spool) -> None:
    """A daemon that holds the lock but does not answer yet: nothing moves, exit 1, its pid."""
    qid = _commit(spool)
    with lock_spool(spool.root):
        code, out, err = _run(spool, "delete", [qid])
    assert (code, out) == (1, "")
    assert err == f"qmgrd: fatal: the daemon (pid {os.getpid()}) is starting; try again\n"
    assert spool.path("incoming", qid).exists()


def test_a_daemon_that_answers_on_the_second_try_does_the_work(
    spool: Spool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """When the shared lock is refused, the daemon is asked once more and its results count."""
    qid = _commit(spool)
    answers: list[dict[str, str] | None] = [None, {qid: "ok"}]
    calls: list[Operation] = []

    def fake_daemon(
        root: object, op: Operation, ids: list[str] | None, queue: str | None
    ) -> dict[str, str] | None:
        calls.append(op)
        return answers.pop(0)

    monkeypatch.setattr(postsuper, "_via_daemon", fake_daemon)
    with lock_spool(spool.root):
        code, out, err = _run(spool, "delete", [qid])
    assert (code, out, err) == (0, "qmgrd: Deleted: 1 message\n", "")
    assert calls == [Operation.DELETE, Operation.DELETE]
    assert spool.path("incoming", qid).exists()  # the (fake) daemon did it, not this process


def test_foreign_text_in_results_is_escaped(
    spool: Spool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An error text with control characters (a file name, a daemon's reply) is escaped."""
    qid = _commit(spool)

    def fake_daemon(
        root: object, op: Operation, ids: list[str] | None, queue: str | None
    ) -> dict[str, str] | None:
        return {qid: "error: cannot move \x1b[2Jx\u202e"}

    monkeypatch.setattr(postsuper, "_via_daemon", fake_daemon)
    code, _, err = _run(spool, "hold", [qid])
    assert code == 1
    assert err == f"qmgrd: warning: {qid}: error: cannot move \\x1b[2Jx\\u202e\n"


def test_a_lock_error_other_than_a_daemon_is_an_operator_error(
    spool: Spool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A spool whose lock file cannot be opened stops the command with a SpoolError."""

    def broken(root: object) -> None:
        raise SpoolError("cannot open the lock file")

    monkeypatch.setattr(postsuper, "lock_spool_shared", broken)
    with pytest.raises(SpoolError, match="lock file"):
        _run(spool, "hold", [_commit(spool)])
