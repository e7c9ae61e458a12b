"""``qmgrd delete|hold|release|requeue ALL QUEUE``: postsuper's queue-name argument."""

from __future__ import annotations

import asyncio
import io
from pathlib import Path

import pytest

from qmgrd.daemon.control import control_socket_path, start_control_server
from qmgrd.delivery.agent import Outcome
from qmgrd.ops.client import ControlError, call
from qmgrd.ops.operation import Operation
from qmgrd.ops.postsuper import UsageError, offline_operate, operate_command, parse_selection
from qmgrd.spool import Spool
from tests.support.agents import FakeAgent
from tests.support.engine import create_test_engine as _engine
from tests.support.engine import run_until_idle as _run_until_idle
from tests.support.engine import stop_engine as _stop
from tests.support.engine import submit as _submit

NOW = 1_700_000_000.0
A = "1K0S000000000AA"


def test_parse_selection_takes_a_queue_name_after_all() -> None:
    """ALL QUEUE selects one queue; a queue the operation does not take is a usage error."""
    assert parse_selection(Operation.DELETE, ["ALL", "deferred"], io.StringIO()) == (
        None,
        "deferred",
    )
    assert parse_selection(Operation.DELETE, ["ALL"], io.StringIO()) == (None, None)
    assert parse_selection(Operation.HOLD, [A], io.StringIO()) == ([A], None)
    with pytest.raises(UsageError, match="release ALL takes a queue name among hold"):
        parse_selection(Operation.RELEASE, ["ALL", "deferred"], io.StringIO())
    with pytest.raises(UsageError, match="not 'bogus'"):
        parse_selection(Operation.DELETE, ["ALL", "bogus"], io.StringIO())
    with pytest.raises(UsageError, match="ALL cannot be combined"):
        parse_selection(Operation.DELETE, ["ALL", A], io.StringIO())


def _spool_with_two_queues(tmp_path: Path) -> tuple[Spool, str, str]:
    _engine_unused, spool, clock = _engine(tmp_path, FakeAgent())
    deferred = _submit(spool, clock, "s@src.test", ["d@a.test"])
    held = _submit(spool, clock, "s@src.test", ["h@a.test"])
    spool.move(deferred, "incoming", "deferred")
    spool.move(held, "incoming", "hold")
    return spool, deferred, held


def test_offline_delete_all_deferred_leaves_other_queues(tmp_path: Path) -> None:
    """Without a daemon, delete ALL deferred removes deferred mail only."""
    spool, deferred, held = _spool_with_two_queues(tmp_path)
    assert offline_operate(spool, Operation.DELETE, None, NOW, queue="deferred") == {deferred: "ok"}
    assert spool.list_ids("deferred") == [] and spool.list_ids("hold") == [held]


def test_cli_without_daemon_prints_the_summary(tmp_path: Path) -> None:
    """`qmgrd requeue ALL hold` (no daemon) requeues held mail and says how many."""
    spool, deferred, held = _spool_with_two_queues(tmp_path)
    out, err = io.StringIO(), io.StringIO()
    code = operate_command(
        spool.root, "requeue", ["ALL", "hold"], stdin=io.StringIO(), out=out, err=err, now=NOW
    )
    assert (code, out.getvalue(), err.getvalue()) == (0, "qmgrd: Requeued: 1 message\n", "")
    assert spool.list_ids("incoming") == [held] and spool.list_ids("deferred") == [deferred]


async def test_daemon_hold_all_deferred_through_the_control_socket(tmp_path: Path) -> None:
    """With the daemon, hold ALL deferred holds the deferred mail and nothing else."""
    agent = FakeAgent(rule=lambda _a: (Outcome.DEFERRED, "4.2.0", "450 later"))
    engine, spool, clock = _engine(tmp_path, agent)
    deferred = _submit(spool, clock, "s@src.test", ["d@a.test"])
    task = await _run_until_idle(engine)
    assert spool.list_ids("deferred") == [deferred]
    other = _submit(spool, clock, "s@src.test", ["i@a.test"])  # waits in incoming/
    server = await start_control_server(control_socket_path(spool.root), engine, spool)
    try:
        path = control_socket_path(spool.root)
        reply = await asyncio.to_thread(
            call, path, {"op": "hold", "ids": "ALL", "queue": "deferred"}
        )
        assert reply["results"] == {deferred: "ok"}
        with pytest.raises(ControlError, match="release takes a queue among hold"):
            await asyncio.to_thread(
                call, path, {"op": "release", "ids": "ALL", "queue": "deferred"}
            )
        with pytest.raises(ControlError, match='only allowed with "ids": "ALL"'):
            await asyncio.to_thread(call, path, {"op": "hold", "ids": [A], "queue": "hold"})
    finally:
        server.close()
        await asyncio.wait_for(server.wait_closed(), 10)
        await _stop(engine, task)
    assert spool.list_ids("hold") == [deferred]
    assert other in spool.list_ids("incoming")
