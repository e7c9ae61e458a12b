"""Content held from the load: bounded per message and in total, sent as the file's bytes,
released when the message's pass ends."""

from __future__ import annotations

from pathlib import Path

import pytest

from qmgrd.daemon import table as table_module
from qmgrd.daemon.table import ActiveMessage, MessageState, MessageTable
from qmgrd.spool import QueueFile, QueueFileContent
from tests.support.agents import FakeAgent
from tests.support.engine import create_test_engine, run_until_idle, stop_engine, submit


def _loaded(table: MessageTable, queue_id: str) -> ActiveMessage:
    record = table.create(queue_id, "incoming", waiting=False)
    assert record is not None
    msg = ActiveMessage(queue_id, Path(queue_id), None, queued_time=0.0)  # type: ignore[arg-type]
    record.active = msg
    table.move(record, MessageState.IN_CORE)
    return msg


def test_the_budget_bounds_what_is_held_and_a_finished_pass_gives_it_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(table_module, "CONTENT_HELD", 10)
    monkeypatch.setattr(table_module, "CONTENT_KEEP", 8)
    table = MessageTable()
    assert table.content_room() == 8
    a, b, c = (_loaded(table, q) for q in ("A", "B", "C"))
    table.hold_content(a, b"123456")
    assert a.content == b"123456" and table.content_room() == 4
    table.hold_content(b, b"12345")  # over the total: not held, its deliveries read the file
    assert b.content is None and table.content_held == 6
    table.hold_content(c, None)
    assert table.content_held == 6
    record = table.find("A")
    assert record is not None
    table.move(record, MessageState.FINISHING)
    assert a.content is None and table.content_held == 0 and table.content_room() == 8


@pytest.mark.parametrize("held", [0, 1 << 20])
async def test_deliveries_send_the_files_content_held_or_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, held: int
) -> None:
    """Small, big (over CONTENT_KEEP) and, with no budget, every message: each delivery gets
    exactly the content in its file; the budget is all back once the engine is idle."""
    monkeypatch.setattr(table_module, "CONTENT_HELD", held)
    agent = FakeAgent()
    engine, spool, clock = create_test_engine(tmp_path, agent)
    bodies = [b"small\r\n", b"x" * (table_module.CONTENT_KEEP + 10) + b"\r\n", b"tiny\r\n"]
    qids = [submit(spool, clock, "s@x.test", [f"r{i}@y.test"], body) for i, body in
            enumerate(bodies)]
    files = {q: QueueFileContent.of(QueueFile.open(spool.path("incoming", q))).read()
             for q in qids}
    task = await run_until_idle(engine)
    try:
        got = dict(zip([q for q, _ in agent.delivered], agent.contents, strict=True))
        assert got == files
        assert engine.ctx.table.content_held == 0
    finally:
        await stop_engine(engine, task)
