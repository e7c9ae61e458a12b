"""postsuper without a daemon: id parsing, spool moves, logs, summaries and exit codes."""

from __future__ import annotations

import io
import os

import pytest

from qmgrd.ops.operation import Operation
from qmgrd.ops.postsuper import UsageError, offline_operate, operate_command, parse_ids
from qmgrd.spool import Envelope, ReasonRecord, RecipientSpec, Spool

NOW = 1_700_000_000.0
A = "AAAAAAAAAAAAAAA"
B = "BBBBBBBBBBBBBBB"


def _commit(spool: Spool, queue: str = "incoming") -> str:
    qid = spool.commit(Envelope("s@x.test", (RecipientSpec("r@y.test"),), NOW - 100), b"x")
    if queue != "incoming":
        spool.move(qid, "incoming", queue, mtime=NOW + 3600)
    return qid


def _where(spool: Spool, qid: str) -> list[str]:
    return [q for q in ("incoming", "active", "deferred", "hold", "corrupt")
            if spool.path(q, qid).exists()]


def _reason(address: str) -> ReasonRecord:
    return ReasonRecord(address, "4.4.1", "delayed", "connection refused", NOW)


def _run(
    spool: Spool, op: Operation | str, args: list[str], stdin: str = ""
) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = operate_command(
        spool.root, op, args, stdin=io.StringIO(stdin), out=out, err=err, now=NOW
    )
    return code, out.getvalue(), err.getvalue()


def test_parse_ids_all_list_and_stdin() -> None:
    """ALL is None; '-' reads ids from stdin and strips mailq's '*' and '!' marks; dups go."""
    assert parse_ids(["ALL"], io.StringIO()) is None
    assert parse_ids([A, "-", A], io.StringIO(f"{B}*\n  {A}!\n")) == [A, B]


@pytest.mark.parametrize(
    ("args", "message"),
    [(["ALL", A], "ALL cannot be combined"), (["../etc"], "invalid queue id: '../etc'"),
     (["-"], "invalid queue id: 'nonsense'")],
)
def test_parse_ids_rejects(args: list[str], message: str) -> None:
    """ALL with ids, and anything that is not a queue id, are usage errors."""
    with pytest.raises(UsageError, match=message):
        parse_ids(args, io.StringIO("nonsense"))


def test_hold_moves_from_every_live_queue(spool: Spool) -> None:
    """hold moves incoming, active (a stopped daemon's) and deferred messages to hold/."""
    ids = [_commit(spool, q) for q in ("incoming", "active", "deferred")]
    already = _commit(spool, "hold")
    results = offline_operate(spool, Operation.HOLD, [*ids, already, A], NOW)
    assert results == {**{q: "ok" for q in ids}, already: "ok", A: "not found"}
    assert all(_where(spool, q) == ["hold"] for q in [*ids, already])


def test_hold_all_skips_held(spool: Spool) -> None:
    """hold ALL reports only the messages it moved."""
    moved = _commit(spool, "deferred")
    _commit(spool, "hold")
    assert offline_operate(spool, Operation.HOLD, None, NOW) == {moved: "ok"}


def test_release_makes_a_held_message_due_now(spool: Spool) -> None:
    """release moves hold -> deferred with mtime now; only held messages are released."""
    held = _commit(spool, "hold")
    waiting = _commit(spool, "deferred")
    assert offline_operate(spool, Operation.RELEASE, [held, waiting], NOW) == {
        held: "ok",
        waiting: "not found",
    }
    assert _where(spool, held) == ["deferred"]
    assert os.stat(spool.path("deferred", held)).st_mtime == NOW
    assert spool.due_ids("deferred", NOW) == [held]


def test_delete_removes_file_and_logs(spool: Spool) -> None:
    """delete removes the queue file and its defer and bounce logs, from any queue."""
    ids = [_commit(spool, q) for q in ("incoming", "active", "deferred", "hold")]
    for qid in ids:
        spool.append_reasons("defer", qid, [_reason("r@y.test")])
        spool.append_reasons("bounce", qid, [_reason("r@y.test")])
    assert offline_operate(spool, Operation.DELETE, None, NOW) == {q: "ok" for q in sorted(ids)}
    for qid in ids:
        assert _where(spool, qid) == []
        assert spool.read_reasons("defer", qid) == []
        assert spool.read_reasons("bounce", qid) == []


def test_requeue_moves_to_incoming_now(spool: Spool) -> None:
    """requeue moves a message from any queue to incoming/ with mtime now, keeping its logs."""
    ids = [_commit(spool, q) for q in ("active", "deferred", "hold")]
    spool.append_reasons("defer", ids[1], [_reason("r@y.test")])
    assert offline_operate(spool, Operation.REQUEUE, ids, NOW) == {q: "ok" for q in ids}
    for qid in ids:
        assert _where(spool, qid) == ["incoming"]
        assert os.stat(spool.path("incoming", qid)).st_mtime == NOW
    assert len(spool.read_reasons("defer", ids[1])) == 1


def test_command_summary_and_exit_codes(spool: Spool) -> None:
    """The command prints postsuper's summary; unknown ids warn and make the exit code 1."""
    a, b = _commit(spool), _commit(spool)
    assert _run(spool, "delete", [a, b]) == (0, "qmgrd: Deleted: 2 messages\n", "")
    c = _commit(spool, "deferred")
    code, out, err = _run(spool, "hold", [c, A])
    assert (code, out) == (1, "qmgrd: Placed on hold: 1 message\n")
    assert err == f"qmgrd: warning: {A}: no such message\n"
    assert _run(spool, "release", ["ALL"]) == (0, "qmgrd: Released from hold: 1 message\n", "")
    assert _run(spool, "requeue", ["-"], stdin=f"{c}\n") == (
        0, "qmgrd: Requeued: 1 message\n", ""
    )
    assert _where(spool, c) == ["incoming"]


def test_command_usage_error(spool: Spool) -> None:
    """A malformed id is a usage error (exit 2) and nothing is touched."""
    qid = _commit(spool)
    code, out, err = _run(spool, "delete", [qid, "not-an-id"])
    assert (code, out) == (2, "")
    assert err == "qmgrd: fatal: invalid queue id: 'not-an-id'\n"
    assert _where(spool, qid) == ["incoming"]


def test_command_empty_stdin(spool: Spool) -> None:
    """'-' with nothing on stdin does nothing and says so."""
    assert _run(spool, "delete", ["-"]) == (0, "", "qmgrd: warning: no queue ids given\n")
