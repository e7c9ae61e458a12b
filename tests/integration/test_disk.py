"""Disk trouble: a full spool file system never yields a 250, never loses a queued message.

Two ways to fill the disk: a real 2 MiB tmpfs mounted on the spool (skipped
where ``mount`` is not permitted), and injected ``ENOSPC`` from the ``os``
calls the spool writes with (``DiskFaults``), which also reaches failures a
tmpfs never produces (an in-place done mark, a rename to ``deferred/``).
Everything runs in process (``e2e.running_daemon``) with a ``FakeClock`` for
the engine, so retries and backoff are driven by advancing the clock.
"""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import aiosmtplib
import pytest

from qmgrd.daemon import outcomes
from qmgrd.spool import QueueFile, recycle
from tests.integration.e2e import InProcessDaemon, message_bytes, running_daemon
from tests.integration.sinks import SinkConfig, SinkServer, smtp_sink
from tests.support.clock import FakeClock
from tests.support.config import write_config
from tests.support.logs import watch_logs
from tests.support.waits import Changes

TIMEOUT = 20.0
_FAULTY = ("write", "writev", "pwrite", "fsync", "rename", "link")


class DiskFaults:
    """While ``full`` is set, the spool's writing ``os`` calls (or just ``names``) fail.

    Each failure notifies ``changes`` (from whichever thread made the call).
    """

    def __init__(self, monkeypatch: pytest.MonkeyPatch, names: tuple[str, ...] = _FAULTY) -> None:
        self.full = False
        self.failures = 0
        self.changes = Changes()
        for name in names:
            monkeypatch.setattr(os, name, self._wrap(getattr(os, name)))

    def _wrap(self, real: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            if self.full:
                self.failures += 1
                self.changes.notify()
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            return real(*args, **kwargs)

        return call


async def send(port: int, rcpts: list[str], subject: str) -> tuple[int, str]:
    """One SMTP transaction; (code, text) of the first non-2xx reply, or of the final 250."""
    client = aiosmtplib.SMTP(hostname="127.0.0.1", port=port, timeout=TIMEOUT, start_tls=False)
    await client.connect()
    try:
        await client.ehlo()
        reply = await client.mail("s@src.test")
        if reply.code != 250:
            return reply.code, reply.message
        for rcpt in rcpts:
            reply = await client.rcpt(rcpt)
        reply = await client.data(message_bytes(subject))
        return reply.code, reply.message
    except aiosmtplib.SMTPResponseException as exc:
        return exc.code, exc.message
    finally:
        client.close()


def _received(sink: SinkServer) -> list[str]:
    return sorted(r for m in sink.messages for r in m.rcpt_tos)


def _recipients_left(path: Path) -> list[str]:
    qf = QueueFile.open(path)
    records, _next = qf.read_recipients(qf.first_recipient_offset, 100)
    return [r.address for r in records]


async def _settle(d: InProcessDaemon, clock: FakeClock, seconds: float) -> None:
    """Move the engine's clock forward and wake it to run its due work."""
    clock.advance(seconds)
    d.engine.wakeup()


def _spool_files(d: InProcessDaemon) -> dict[str, list[str]]:
    return {q: d.queue_ids(q) for q in ("incoming", "active", "deferred", "corrupt")}


async def _after_space_returns(
    d: InProcessDaemon, clock: FakeClock, first: str, subject: str
) -> None:
    """The finish retry moves ``first`` to deferred/, its retry delivers it, and a new message
    (to b@dst.test) is accepted and delivered: the spool ends empty."""
    await _settle(d, clock, 5.0)
    await d.wait_idle()  # the finish retry is pending work: idle only once it worked
    assert d.queue_ids("deferred") == [first]
    await _settle(d, clock, 4000.0)
    await d.wait_idle()
    code, text = await send(d.port, ["b@dst.test"], subject)
    assert code == 250, text
    await d.wait_idle()
    assert _spool_files(d) == {"incoming": [], "active": [], "deferred": [], "corrupt": []}


async def test_injected_enospc_gives_451_keeps_files_and_recovers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ENOSPC: DATA gets 451 (no 250, no file); a sent recipient whose done mark fails stays
    queued in active/, the failed move to deferred/ is retried until it works, then the
    message is retried and everything is delivered and removed."""
    faults = DiskFaults(monkeypatch)
    # The last delivery's early removal (qmgrd.daemon.outcomes: a rename into recycle/ made
    # through renameat2) fails as well, so its done mark is written, and fails.
    monkeypatch.setattr(outcomes, "retire", faults._wrap(recycle.retire))
    clock = FakeClock(time.time())
    async with smtp_sink(SinkConfig(stall=frozenset({"DOT"}))) as sink:
        conf = write_config(tmp_path, main=f"relayhost = {sink.nexthop}\n")
        with watch_logs() as logs:
            async with running_daemon(conf, clock=clock) as d:
                d.engine.retry_delay = 5.0
                code, text = await send(d.port, ["a@dst.test"], "first")
                assert code == 250, text
                first = text.rsplit(" ", 1)[-1]
                await sink.wait_for(lambda: "DATA" in sink.commands, "the delivery to reach DATA")
                faults.full = True
                # Intake while full: refused with 451, nothing left in incoming/.
                code, text = await send(d.port, ["b@dst.test"], "second")
                assert code == 451, (code, text)
                assert os.listdir(d.spool.root / "incoming") == []
                # The delivery in progress completes at the sink; its done mark fails.
                sink.release()
                await sink.wait_messages(1)
                assert len(sink.messages) == 1
                await logs.wait_event("cannot finish")
                assert d.queue_ids("active") == [first]
                assert _recipients_left(d.spool.path("active", first)) == ["a@dst.test"]
                # Still full at the first retry: the file stays where it is.
                before = faults.failures
                await _settle(d, clock, 5.0)
                await faults.changes.wait_for(lambda: faults.failures > before, "the retry")
                await logs.wait_event("cannot finish", count=2)
                assert d.queue_ids("active") == [first]
                # Space returns: the retry moves it to deferred/, the next run delivers it.
                faults.full = False
                await _after_space_returns(d, clock, first, "second")
    # The first message was sent twice (its done mark was lost), the second once.
    assert _received(sink) == ["a@dst.test", "a@dst.test", "b@dst.test"]
    assert not any(e.get("code", "").startswith("250") for e in logs)


async def test_failed_move_to_active_is_retried_by_an_incoming_rescan(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A message whose move from incoming/ to active/ fails stays in incoming/ and is picked
    up again after retry_delay (incoming/ is otherwise scanned only at start)."""
    faults = DiskFaults(monkeypatch, names=("rename",))  # commit links, the engine renames
    clock = FakeClock(time.time())
    async with smtp_sink() as sink:
        conf = write_config(tmp_path, main=f"relayhost = {sink.nexthop}\n")
        with watch_logs() as logs:
            async with running_daemon(conf, clock=clock) as d:
                faults.full = True
                qid = d.enqueue("s@src.test", ["r@dst.test"])
                await logs.wait_event("cannot move message")
                assert d.queue_ids("incoming") == [qid]
                faults.full = False
                await _settle(d, clock, 5.0)
                await d.wait_idle()
                assert _spool_files(d)["incoming"] == [] and _spool_files(d)["active"] == []
    assert _received(sink) == ["r@dst.test"]


@pytest.fixture
def tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A 2 MiB tmpfs at tmp_path/spool (skip the test where mounting is not permitted)."""
    mnt = tmp_path / "spool"
    mnt.mkdir()
    if shutil.which("mount") is None:
        pytest.skip("no mount command")
    proc = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=2m,mode=0700", "tmpfs", str(mnt)],
        capture_output=True,
        check=False,
        timeout=10,
    )
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs: {proc.stderr.decode(errors='replace').strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False, timeout=10)


def _fill(directory: Path) -> Path:
    """Write zeros into directory/filler until the file system is full."""
    filler = directory / "filler"
    chunk = b"\0" * 65536
    with open(filler, "wb", buffering=0) as f:
        for _ in range(1000):  # bounded: 64 MiB, far more than the 2 MiB tmpfs
            try:
                f.write(chunk)
            except OSError as exc:
                assert exc.errno == errno.ENOSPC
                break
        else:
            raise AssertionError("the tmpfs never filled up")
    return filler


async def test_full_tmpfs_refuses_mail_with_452_and_resumes(tmp_path: Path, tmpfs: Path) -> None:
    """A really full spool file system: MAIL gets 452 4.3.1, a deferral's reason log cannot be
    written so the message stays in active/ (never lost), and all proceeds once space returns."""
    clock = FakeClock(time.time())
    cfg = SinkConfig(stall=frozenset({"DOT"}), rcpt_replies={"later@dst.test": (450, "4.2.0 busy")})
    async with smtp_sink(cfg) as sink:
        conf = write_config(tmp_path, main=f"relayhost = {sink.nexthop}\n")
        with watch_logs() as logs:
            async with running_daemon(conf, clock=clock, fsync=True) as d:
                d.engine.retry_delay = 5.0
                code, text = await send(d.port, ["a@dst.test", "later@dst.test"], "first")
                assert code == 250, text
                first = text.rsplit(" ", 1)[-1]
                await sink.wait_for(lambda: "DATA" in sink.commands, "the delivery to reach DATA")
                filler = _fill(tmpfs)
                for i in range(3):
                    code, text = await send(d.port, ["b@dst.test"], f"refused {i}")
                    assert code == 452 and "4.3.1" in text, (code, text)
                sink.release()
                await logs.wait_event("cannot finish")
                assert d.queue_ids("active") == [first]
                assert _recipients_left(d.spool.path("active", first)) == ["later@dst.test"]
                filler.unlink()
                sink.config.rcpt_replies.clear()
                await _after_space_returns(d, clock, first, "accepted")
    assert _received(sink) == ["a@dst.test", "b@dst.test", "later@dst.test"]
    rejects = [e for e in logs if e.get("code") == "452 4.3.1"]
    assert len(rejects) == 3 and all(e["client"] == "unknown[127.0.0.1]" for e in rejects)
