"""Corrupt and foreign files in every queue directory, through the real engine.

Each bad file ends in corrupt/ (or is refused) with a warning naming it; the
engine keeps running and delivers every good message exactly once. The agent
is a fake (``tests.support.agents.FakeAgent``, no network); the spool,
scheduler and engine are the real ones.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from qmgrd.spool import Envelope, QueueFile, RecipientSpec, Spool, new_queue_id
from tests.support.agents import FakeAgent
from tests.support.clock import FakeClock
from tests.support.engine import create_test_engine, run_until_idle, stop_engine

TIMEOUT = 20


def _commit(spool: Spool, clock: FakeClock, rcpt: str, queue: str = "incoming") -> str:
    env = Envelope(sender="s@src.test", recipients=(RecipientSpec(rcpt),), arrival_time=clock.now())
    qid = spool.commit(env, b"Subject: t\r\n\r\nbody of " + rcpt.encode() + b"\r\n")
    if queue != "incoming":
        spool.move(qid, "incoming", queue, mtime=clock.now() - 10)
    return qid


def _valid_bytes(spool: Spool, clock: FakeClock) -> bytes:
    qid = _commit(spool, clock, "template@dst.test")
    data = spool.path("incoming", qid).read_bytes()
    spool.remove("incoming", qid)
    return data


def _plant(spool: Spool, queue: str, data: bytes, mtime: float) -> str:
    qid = new_queue_id()
    path = spool.path(queue, qid)
    path.write_bytes(data)
    os.utime(path, (mtime, mtime))
    return qid


def _corrupt_names(spool: Spool) -> set[str]:
    return set(os.listdir(spool.root / "corrupt"))


def _warned(logs: Sequence[Mapping[str, Any]]) -> set[str]:
    """Queue ids / names named by corrupt-file warnings (quarantine or foreign-file sweep)."""
    out = set()
    for e in logs:
        if e.get("log_level") != "warning":
            continue
        if e["event"] == "corrupt queue file":
            out.add(str(e["queue_id"]))
        elif e["event"].startswith("foreign file"):
            out.add(str(e["file"]).split("/", 1)[1])
    return out


async def test_bad_files_everywhere_at_start_are_quarantined_and_good_mail_flows(
    tmp_path: Path,
) -> None:
    """Truncated, garbage, empty, unknown-record, symlinked, FIFO and dir entries go to corrupt/."""
    agent = FakeAgent()
    engine, spool, clock = create_test_engine(tmp_path, agent)
    now = clock.now()
    good = _valid_bytes(spool, clock)
    good_ids = {
        _commit(spool, clock, "in@dst.test"): "in@dst.test",
        _commit(spool, clock, "def@dst.test", "deferred"): "def@dst.test",
        _commit(spool, clock, "act@dst.test", "active"): "act@dst.test",
    }
    bad: dict[str, str] = {}
    bad[_plant(spool, "incoming", good[: len(good) // 2], now)] = "truncated"
    bad[_plant(spool, "deferred", os.urandom(500), now - 10)] = "garbage"
    bad[_plant(spool, "active", b"", now)] = "zero length"
    bad[_plant(spool, "incoming", good[:65] + b"Z" + good[66:], now)] = "unknown record"
    outside = tmp_path / "outside-queue-file"
    outside.write_bytes(good)
    link = new_queue_id()
    spool.path("incoming", link).symlink_to(outside)
    bad[link] = "symlink"
    dangling = new_queue_id()
    spool.path("deferred", dangling).symlink_to(tmp_path / "nowhere")
    bad[dangling] = "dangling symlink"
    fifo = new_queue_id()
    os.mkfifo(spool.path("deferred", fifo))
    bad[fifo] = "fifo"
    subdir = new_queue_id()
    spool.path("active", subdir).mkdir()
    bad[subdir] = "directory"
    hold_link = new_queue_id()
    spool.path("hold", hold_link).symlink_to(outside)
    bad[hold_link] = "symlink in hold"
    (spool.root / "incoming" / "stray-name").write_bytes(b"not mail")
    bad["stray-name"] = "stray"

    with capture_logs() as logs:
        task = await run_until_idle(engine)
        await stop_engine(engine, task)

    assert sorted(agent.delivered) == sorted(good_ids.items())
    assert _corrupt_names(spool) == set(bad)
    assert _warned(logs) >= set(bad)
    assert outside.read_bytes() == good  # the symlink target was never touched
    assert (spool.root / "corrupt" / link).is_symlink()
    for queue in ("incoming", "active", "deferred", "hold"):
        assert os.listdir(spool.root / queue) == [], queue


async def test_bad_files_arriving_at_runtime_do_not_stop_the_engine(tmp_path: Path) -> None:
    """Files dropped into incoming/ while running are quarantined; later mail is still delivered."""
    agent = FakeAgent()
    engine, spool, clock = create_test_engine(tmp_path, agent)
    good = _valid_bytes(spool, clock)
    task = await run_until_idle(engine)
    with capture_logs() as logs:
        bad = [
            _plant(spool, "incoming", good[:-1], clock.now()),  # lost its end record
            _plant(spool, "incoming", b"\x00" * 4096, clock.now()),
            _plant(spool, "incoming", b"", clock.now()),
        ]
        link = new_queue_id()
        spool.path("incoming", link).symlink_to(spool.root / "incoming")
        bad.append(link)
        missing = new_queue_id()  # announced but never written (deleted by an operator)
        for qid in [*bad, missing]:
            engine.notify_incoming(qid)
        ok = _commit(spool, clock, "after@dst.test")
        engine.notify_incoming(ok)
        await asyncio.wait_for(engine.wait_idle(), TIMEOUT)
    await stop_engine(engine, task)
    assert agent.delivered == [(ok, "after@dst.test")]
    assert _corrupt_names(spool) == set(bad)
    assert _warned(logs) == set(bad)
    assert spool.list_ids("active") == [] and spool.list_ids("incoming") == []


async def test_damaged_recipient_area_quarantines_without_delivering(tmp_path: Path) -> None:
    """A file whose envelope parses but whose recipient records are damaged ends in corrupt/."""
    agent = FakeAgent()
    engine, spool, clock = create_test_engine(tmp_path, agent)
    env = Envelope(
        sender="s@src.test",
        recipients=(RecipientSpec("a@dst.test"), RecipientSpec("b@dst.test")),
        arrival_time=clock.now(),
    )
    qid = spool.commit(env, b"Subject: t\r\n\r\nx\r\n")
    path = spool.path("incoming", qid)
    qf = QueueFile.open(path)
    second = qf.read_all_recipients()[1].offset
    with open(path, "r+b") as f:
        f.seek(second)
        f.write(b"?")
    ok = _commit(spool, clock, "fine@dst.test")
    with capture_logs() as logs:
        task = await run_until_idle(engine)
        await stop_engine(engine, task)
    assert agent.delivered == [(ok, "fine@dst.test")]
    assert _corrupt_names(spool) == {qid}
    assert qid in _warned(logs)


async def test_unreadable_file_is_retried_not_quarantined(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A queue file the daemon may not open (EACCES, simulated: we run as root) is a system
    error, not damage: it goes back to incoming/ (logged), and once readable it is delivered."""
    agent = FakeAgent()
    engine, spool, clock = create_test_engine(tmp_path, agent)
    locked = _commit(spool, clock, "locked@dst.test")
    ok = _commit(spool, clock, "ok@dst.test")
    real_open: Callable[..., int] = os.open
    denied = {"on": True}

    def fake_open(path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
        if denied["on"] and os.fspath(path).endswith(os.path.join("active", locked)):
            raise PermissionError(13, "Permission denied", os.fspath(path))
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", fake_open)
    with capture_logs() as logs:
        task = asyncio.create_task(engine.run())
        try:
            await asyncio.wait_for(
                engine.wait_until(
                    lambda: agent.delivered == [(ok, "ok@dst.test")]
                    and any(e["event"] == "cannot open queue file, retried later" for e in logs)
                ),
                20,
            )
            assert spool.list_ids("incoming") == [locked]
            assert _corrupt_names(spool) == set()
            denied["on"] = False
            clock.advance(engine.ctx.retry_delay + 1)
            await asyncio.wait_for(engine.wait_idle(), 20)
        finally:
            await stop_engine(engine, task)
    monkeypatch.undo()
    assert sorted(agent.delivered) == sorted([(ok, "ok@dst.test"), (locked, "locked@dst.test")])
    assert _corrupt_names(spool) == set()
    [event] = [e for e in logs if e["event"] == "cannot open queue file, retried later"]
    assert event["queue_id"] == locked and "Permission denied" in event["error"]
