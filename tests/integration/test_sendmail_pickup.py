"""sendmail as a process, the maildrop queue and the pickup into a running daemon.

run.py does not start the pickup yet (the composition root is being refactored
elsewhere), so the "daemon" here is the in-process engine of ``e2e`` with a
`Pickup` wired exactly as run.py should: ``recover()`` after the engine's
start-up, ``run(stop)`` as a task, ``notify=engine.notify_incoming``.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from qmgrd.cleanup import CleanupSettings
from qmgrd.config import load_config
from qmgrd.daemon.pickup import Pickup
from qmgrd.spool import Spool
from tests.integration.e2e import (
    TIMEOUT,
    InProcessDaemon,
    start_daemon,
    wait_for_messages,
    write_config,
)
from tests.integration.sinks import SinkServer, smtp_sink

REPO = Path(__file__).resolve().parents[2]
SENDMAIL = [sys.executable, "-m", "qmgrd.sendmail"]


def make_pickup(conf: Path, spool: Spool, notify: object = None) -> Pickup:
    cfg = load_config(conf, hostname="mx.test")
    pickup = Pickup(
        spool,
        cfg.get_path("maildrop_directory"),
        CleanupSettings.from_config(cfg),
        notify=notify if callable(notify) else (lambda _qid: None),
        size_limit=cfg.get_int("message_size_limit"),
    )
    pickup.ensure_dir()
    return pickup


@contextlib.asynccontextmanager
async def daemon_with_pickup(conf: Path) -> AsyncIterator[tuple[InProcessDaemon, Pickup]]:
    """The daemon (engine and its own running pickup, as ``qmgrd run`` wires them)."""
    daemon = await start_daemon(conf, listen=False)
    try:
        yield daemon, daemon.parts.pickup
    finally:
        await daemon.stop()


def env_for(conf: Path) -> dict[str, str]:
    return {**os.environ, "MAIL_CONFIG": str(conf), "PYTHONPATH": str(REPO)}


async def shell(command: str, conf: Path, stdin: bytes = b"") -> tuple[int, bytes, bytes]:
    proc = await asyncio.create_subprocess_shell(
        command,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env_for(conf),
        cwd=str(REPO),
    )
    out, err = await asyncio.wait_for(proc.communicate(stdin), TIMEOUT)
    assert proc.returncode is not None
    return proc.returncode, out, err


def sendmail_cmd() -> str:
    return f"{sys.executable} -m qmgrd.sendmail"


def setup(tmp_path: Path, sink: SinkServer) -> Path:
    conf = write_config(tmp_path, main=f"relayhost = {sink.nexthop}\nmyorigin = origin.test\n")
    spool = Spool(tmp_path / "spool", fsync=False)
    spool.ensure_dirs()
    make_pickup(conf, spool)  # creates maildrop/ as an installer would
    return conf


async def test_sendmail_t_i_from_a_shell_pipe_reaches_the_sink(tmp_path: Path) -> None:
    """printf | sendmail -t -i: the sink gets it with Received, Date, Message-Id, qualified From."""
    async with smtp_sink() as sink:
        conf = setup(tmp_path, sink)
        async with daemon_with_pickup(conf):
            code, _out, err = await shell(
                f"printf 'To: user@dst.test\\nSubject: cron\\n\\nline one\\n.\\nline two\\n' "
                f"| {sendmail_cmd()} -t -i -f root",
                conf,
            )
            assert code == 0, err
            await wait_for_messages(sink, 1)
        message = sink.messages[0]
        assert message.mail_from == "root@origin.test"
        assert message.rcpt_tos == ["user@dst.test"]
        head, _, body = message.content.partition(b"\r\n\r\n")
        assert head.startswith(b"Received: by mx.test (qmgrd, from userid ")
        assert re.search(rb"\r\nFrom: root@origin.test\r\n", head + b"\r\n")
        assert re.search(rb"\r\nMessage-Id: <\d{14}\.[0-9A-Z]+@mx\.test>", head)
        assert b"\r\nDate: " in head
        assert body == b"line one\r\n.\r\nline two\r\n"  # -i: a lone dot is data


async def test_pickup_is_immediate_while_the_daemon_runs(tmp_path: Path) -> None:
    """A submission is picked up through the FIFO poke well before the 60 s backstop."""
    async with smtp_sink() as sink:
        conf = setup(tmp_path, sink)
        async with daemon_with_pickup(conf):
            started = time.monotonic()
            code, _, err = await shell(f"{sendmail_cmd()} -i a@dst.test", conf, b"Subject: x\n\n")
            assert code == 0, err
            await wait_for_messages(sink, 1, timeout=20)
            assert time.monotonic() - started < 20


async def test_bs_speaks_smtp(tmp_path: Path) -> None:
    """sendmail -bs: greeting, EHLO, MAIL, RCPT, DATA, QUIT on stdin/stdout; mail delivered."""
    async with smtp_sink() as sink:
        conf = setup(tmp_path, sink)
        dialogue = (
            b"EHLO client\r\nMAIL FROM:<s@src.test>\r\nRCPT TO:<r@dst.test>\r\nDATA\r\n"
            b"Subject: bs\r\n\r\n..stuffed\r\n.\r\nQUIT\r\n"
        )
        code, out, _ = await shell(f"{sendmail_cmd()} -bs", conf, dialogue)
        assert code == 0
        replies = [line.split(b" ")[0][:3] for line in out.split(b"\r\n") if line]
        assert replies[0] == b"220" and b"354" in replies and replies[-1] == b"221"
        assert b"250 2.0.0 Ok: queued as " in out
        async with daemon_with_pickup(conf):
            await wait_for_messages(sink, 1)
        assert sink.messages[0].content.endswith(b"\r\n\r\n.stuffed\r\n")


@pytest.mark.slow
async def test_hundred_submissions_with_the_daemon_stopped_are_delivered_once(
    tmp_path: Path,
) -> None:
    """100 sendmail runs while stopped are kept in maildrop and delivered exactly once."""
    from qmgrd.sendmail.command import main

    async with smtp_sink() as sink:
        conf = setup(tmp_path, sink)
        for i in range(100):
            stdin = io.BytesIO(f"Subject: n{i}\n\nbody {i}\n".encode())
            assert main(["-i", f"u{i}@dst.test"], config_dir=str(conf), stdin=stdin) == 0
        assert len(list((tmp_path / "spool" / "maildrop").iterdir())) == 101  # + .wakeup
        async with daemon_with_pickup(conf) as (daemon, _):
            await wait_for_messages(sink, 100, timeout=60)
            await daemon.wait_idle()
        subjects = sorted(
            re.search(rb"Subject: (n\d+)", m.content).group(1)  # type: ignore[union-attr]
            for m in sink.messages
        )
        assert subjects == sorted(f"n{i}".encode() for i in range(100))
        assert [p.name for p in (tmp_path / "spool" / "maildrop").iterdir()] == [".wakeup"]


PICKUP_CHILD = """
import sys
from pathlib import Path
from qmgrd.cleanup import CleanupSettings
from qmgrd.config import load_config
from qmgrd.daemon.pickup import Pickup
from qmgrd.spool import Spool
cfg = load_config(Path(sys.argv[1]), hostname="mx.test")
spool = Spool(cfg.get_path("queue_directory"), fsync=True)
p = Pickup(spool, cfg.get_path("maildrop_directory"), CleanupSettings.from_config(cfg),
           notify=lambda q: None, size_limit=cfg.get_int("message_size_limit"))
p.scan()
"""


@pytest.mark.slow
def test_sigkill_during_pickup_loses_and_duplicates_nothing(tmp_path: Path) -> None:
    """A pickup killed mid-way, then restarted: each of 100 messages is queued exactly once."""
    from qmgrd.sendmail.command import main

    conf = write_config(tmp_path, main="relayhost = [127.0.0.1]:9\n")
    spool = Spool(tmp_path / "spool", fsync=False)
    spool.ensure_dirs()
    pickup = make_pickup(conf, spool)
    for i in range(100):
        stdin = io.BytesIO(f"Subject: n{i}\n\nbody\n".encode())
        assert main(["-i", f"u{i}@dst.test"], config_dir=str(conf), stdin=stdin) == 0
    child = subprocess.Popen(
        [sys.executable, "-c", PICKUP_CHILD, str(conf)], cwd=REPO, env=env_for(conf)
    )
    try:
        deadline = time.monotonic() + TIMEOUT
        while len(spool.list_ids("incoming")) < 20 and time.monotonic() < deadline:
            if child.poll() is not None:
                break
            time.sleep(0.001)  # polling a child process's progress; no timing is asserted
        at_kill = len(spool.list_ids("incoming"))
        child.send_signal(signal.SIGKILL)
    finally:
        child.wait(TIMEOUT)
    assert 0 < at_kill < 100, at_kill  # killed in the middle of the pickup
    spool.remove_temp_files()  # the daemon's start-up sweep, before recover()
    pickup.recover()
    subjects: list[bytes] = []
    for qid in spool.list_ids("incoming"):
        content = (spool.root / "incoming" / qid).read_bytes()
        found = re.search(rb"Subject: (n\d+)", content)
        assert found is not None
        subjects.append(found.group(1))
    assert sorted(subjects) == sorted(f"n{i}".encode() for i in range(100))
    assert [p.name for p in pickup.maildrop.iterdir()] == [".wakeup"]
