"""Corrupt and foreign files in every queue directory, through the real engine.

Each bad file ends in corrupt/ (or is refused) with a warning naming it; the
engine keeps running and delivers every good message exactly once. The agent
is a fake (no network); the spool, scheduler and engine are the real ones.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from qmgrd.config import load_config
from qmgrd.daemon.assemble import create_engine
from qmgrd.daemon.clock import FakeClock
from qmgrd.daemon.engine import Engine
from qmgrd.delivery.agent import DeliveryRequest, DeliveryResult, Outcome, RecipientResult
from qmgrd.spool import Envelope, QueueFile, RecipientSpec, Spool, new_queue_id

TIMEOUT = 20


@dataclass
class RecordingAgent:
    """Accepts everything and records (queue id, recipient, content) per delivery."""

    delivered: list[tuple[str, str]] = field(default_factory=list)
    contents: dict[str, bytes] = field(default_factory=dict)

    async def deliver(self, request: DeliveryRequest) -> DeliveryResult:
        """Read the whole content, as a real agent would, and report every recipient sent."""
        content = b"".join([c async for c in request.content.chunks()])
        self.contents[request.queue_id] = content
        results = []
        for r in request.recipients:
            self.delivered.append((request.queue_id, r.address))
            results.append(RecipientResult(r, Outcome.SENT, "2.0.0", "250 ok", "sink[127.0.0.1]"))
        return DeliveryResult(tuple(results))

    async def close(self) -> None:
        """Nothing to release."""


def _engine(tmp_path: Path, agent: RecordingAgent) -> tuple[Engine, Spool, FakeClock]:
    conf = tmp_path / "conf"
    conf.mkdir()
    (conf / "main.cf").write_text(f"queue_directory = {tmp_path / 'spool'}\nmyhostname = mx.test\n")
    (conf / "master.cf").write_text(
        "smtp unix - - n - - smtp\nrelay unix - - n - - smtp\nerror unix - - n - - error\n"
        "retry unix - - n - - retry\ndiscard unix - - n - - discard\n"
    )
    cfg = load_config(conf, hostname="mx.test")
    clock = FakeClock()
    spool = Spool(tmp_path / "spool", fsync=False)
    spool.ensure_dirs()
    engine = create_engine(cfg, spool=spool, clock=clock, agents={"smtp": agent, "relay": agent})
    return engine, spool, clock


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


async def _run(engine: Engine) -> asyncio.Task[None]:
    task = asyncio.create_task(engine.run())
    await asyncio.wait_for(engine.wait_idle(), TIMEOUT)
    return task


async def _stop(engine: Engine, task: asyncio.Task[None]) -> None:
    engine.stop()
    await asyncio.wait_for(task, TIMEOUT)


def _corrupt_names(spool: Spool) -> set[str]:
    return set(os.listdir(spool.root / "corrupt"))


def _warned(logs: list[dict[str, Any]]) -> set[str]:
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
    agent = RecordingAgent()
    engine, spool, clock = _engine(tmp_path, agent)
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
        task = await _run(engine)
        await _stop(engine, task)

    assert sorted(agent.delivered) == sorted(good_ids.items())
    assert _corrupt_names(spool) == set(bad)
    assert _warned(logs) >= set(bad)
    assert outside.read_bytes() == good  # the symlink target was never touched
    assert (spool.root / "corrupt" / link).is_symlink()
    for queue in ("incoming", "active", "deferred", "hold"):
        assert os.listdir(spool.root / queue) == [], queue


async def test_bad_files_arriving_at_runtime_do_not_stop_the_engine(tmp_path: Path) -> None:
    """Files dropped into incoming/ while running are quarantined; later mail is still delivered."""
    agent = RecordingAgent()
    engine, spool, clock = _engine(tmp_path, agent)
    good = _valid_bytes(spool, clock)
    task = await _run(engine)
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
    await _stop(engine, task)
    assert agent.delivered == [(ok, "after@dst.test")]
    assert _corrupt_names(spool) == set(bad)
    assert _warned(logs) == set(bad)
    assert spool.list_ids("active") == [] and spool.list_ids("incoming") == []


async def test_damaged_recipient_area_quarantines_without_delivering(tmp_path: Path) -> None:
    """A file whose envelope parses but whose recipient records are damaged ends in corrupt/."""
    agent = RecordingAgent()
    engine, spool, clock = _engine(tmp_path, agent)
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
        task = await _run(engine)
        await _stop(engine, task)
    assert agent.delivered == [(ok, "fine@dst.test")]
    assert _corrupt_names(spool) == {qid}
    assert qid in _warned(logs)


async def test_unreadable_file_is_quarantined_with_the_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A queue file the daemon may not open (EACCES, simulated: we run as root) goes to corrupt/."""
    agent = RecordingAgent()
    engine, spool, clock = _engine(tmp_path, agent)
    locked = _commit(spool, clock, "locked@dst.test")
    ok = _commit(spool, clock, "ok@dst.test")
    real_open: Callable[..., int] = os.open

    def fake_open(path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
        if os.fspath(path).endswith(os.path.join("active", locked)):
            raise PermissionError(13, "Permission denied", os.fspath(path))
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", fake_open)
    with capture_logs() as logs:
        task = await _run(engine)
        await _stop(engine, task)
    monkeypatch.undo()
    assert agent.delivered == [(ok, "ok@dst.test")]
    assert _corrupt_names(spool) == {locked}
    reasons = [e["reason"] for e in logs if e["event"] == "corrupt queue file"]
    assert len(reasons) == 1 and "Permission denied" in reasons[0]
