"""A listener worker's CPU per SMTP session over real sockets: accept to disconnect, and commit.

    .venv/bin/python bench/sessionpath.py                  # 2000 sessions, 3 rounds
    .venv/bin/python bench/sessionpath.py -m 600 --rounds 1 --dir /dev/shm
    for m in 300 900; do valgrind --tool=callgrind --callgrind-out-file=/tmp/sp_$m.out \\
        .venv/bin/python bench/sessionpath.py -m $m --rounds 1 --dir /dev/shm 2>&1 \\
        | grep "I   refs"; done        # instructions per session: (I(900) - I(300)) / 600

This process runs the real listener (``qmgrd.listener.server.start_listener``)
on uvloop on a free loopback port, set up as a listener worker process sets
it up for a bench main.cf (``qmgrd.daemon.smtpd``: accept batch
``WORKER_ACCEPT_BATCH``, the ``CountingIntake`` observer and the commit
notices written to a channel by an ``Outbox``, ``WorkerFlowGate``, the
regulator's ``TokenGate`` with its ``in_flow_delay`` pipe; the maillog file;
the group commit with fsync on). The regulator's loop-lag sampler and load
reports are not started: they cost per second, not per session, and would
make the count depend on time. The token pipe is filled before a round with a
token for every message.

Clients: ``smtp-source -s 20 -m M -l 1024 -f from@x -t to@y`` (``--source``,
default /usr/sbin/smtp-source: a new session per message, EHLO, MAIL, RCPT,
DATA, QUIT), started with ``exec`` in a process of its own, and a second
helper process (this script with ``--drain``) playing the queue manager's
part: it reads the commit notices and retires each committed queue file
``LAG`` commits later into the recycle pool, as the queue manager does once
delivered. Neither runs in this process, so under valgrind (which follows no
``exec`` unless told to) only the server is measured.

Printed per round: sessions, the messages the helper saw committed, and this
process's CPU (``time.process_time``) per session in ms; at the end the maillog's
line count (``--keep-log PATH`` keeps the file, to compare two versions' lines). A benchmark prints;
nothing is asserted. Everything binds to 127.0.0.1; each round is bounded by
``--timeout``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import fcntl
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections import deque
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from qmgrd.cleanup import CleanupSettings
from qmgrd.config import Config, load_config
from qmgrd.daemon.intakeflow import FlowSettings, WorkerRegulator
from qmgrd.daemon.ipc import CountingIntake, encode_commit
from qmgrd.daemon.process import loop_factory, open_log_output
from qmgrd.daemon.smtpd import WORKER_ACCEPT_BATCH, Outbox, WorkerFlowGate
from qmgrd.listener.observer import Committed
from qmgrd.listener.server import start_listener
from qmgrd.listener.services import listener_settings
from qmgrd.spool import Spool
from qmgrd.spool.recycle import Recycler, retire

REPO = Path(__file__).resolve().parents[1]
SOURCE = "/usr/sbin/smtp-source"
LAG = 200  # commits between a message's commit and its retirement (the helper)
SIZE = 1024  # smtp-source -l
_F_SETPIPE_SZ = 1031  # fcntl (Linux)


def drain(fd: int, spool: str) -> int:
    """The helper (``--drain``): read commit notices from ``fd`` until its end, retire files."""
    waiting: deque[str] = deque()
    seen = 0
    with socket.socket(fileno=fd) as sock, sock.makefile("rb") as stream:
        for line in stream:
            fields = json.loads(line)
            if fields and fields[0] == "c":
                seen += 1
                waiting.append(str(fields[1]))
                if len(waiting) > LAG:
                    retire(spool, "incoming", waiting.popleft(), SIZE)
    print(seen, flush=True)
    return 0


def _config(root: Path) -> Config:
    conf = root / "etc"
    conf.mkdir()
    (conf / "main.cf").write_text(
        f"queue_directory = {root / 'spool'}\nsmtpd_listen = 127.0.0.1:0\n"
        "myhostname = relay.bench\nmynetworks = 127.0.0.0/8\n"
        f"relayhost = [127.0.0.1]:2526\nmaillog_file = {root / 'maillog'}\n"
    )
    shutil.copy(REPO / "config" / "master.cf", conf / "master.cf")
    return load_config(conf)


def _token_pipe(count: int) -> int:
    """The read end of a pipe holding ``count`` tokens (the queue manager's, prefilled)."""
    rfd, wfd = os.pipe()
    with contextlib.suppress(OSError):
        fcntl.fcntl(wfd, _F_SETPIPE_SZ, max(count, 65536))  # room for every token
    os.set_blocking(wfd, False)
    with contextlib.suppress(BlockingIOError):  # as many as fit; the rest wait in_flow_delay
        os.write(wfd, b"t" * count)
    os.close(wfd)
    return rfd


async def run_round(cfg: Config, spool: Spool, args: argparse.Namespace) -> tuple[float, str]:
    """CPU seconds per session of one round, and what the helper reported."""
    settings = listener_settings(cfg, cleanup=CleanupSettings.from_config(cfg))[0]
    ours, theirs = socket.socketpair()
    outbox = Outbox()
    _, writer = await asyncio.open_unix_connection(sock=ours)
    outbox.open(writer)
    intake = CountingIntake(outbox.send)
    tokens = _token_pipe(args.m + 64)
    regulator = WorkerRegulator(tokens, FlowSettings.from_config(cfg))
    regulator.sessions = lambda: intake.sessions
    intake.gate = regulator.gate

    def committed(c: Committed) -> None:
        outbox.send(encode_commit(c))

    lsock = socket.socket()
    lsock.bind(("127.0.0.1", 0))
    lsock.listen(128)
    port = lsock.getsockname()[1]
    handle = await start_listener(
        settings,
        spool,
        on_commit=committed,
        observer=intake,
        gate=WorkerFlowGate(cfg),
        sockets=[lsock],
        accept_batch=WORKER_ACCEPT_BATCH,
        recycler=Recycler(str(spool.root), part=0, parts=1),
    )
    handle.ctx.inflow = regulator.gate
    helper = subprocess.Popen(
        [sys.executable, __file__, "--drain", str(theirs.fileno()), str(spool.root)],
        pass_fds=[theirs.fileno()],
        stdout=subprocess.PIPE,
        text=True,
    )
    theirs.close()
    loop = asyncio.get_running_loop()
    start = time.process_time()
    source = subprocess.Popen(
        [
            *(args.source, "-s", "20", "-m", str(args.m), "-l", str(SIZE)),
            *("-f", "from@x", "-t", "to@y", f"127.0.0.1:{port}"),
        ],
        stdout=subprocess.DEVNULL,
    )
    try:
        await asyncio.wait_for(loop.run_in_executor(None, source.wait), args.timeout)
        while handle.sessions:  # the last disconnect lines
            await asyncio.sleep(0.01)
        used = time.process_time() - start
    finally:
        if source.poll() is None:
            source.kill()
        await handle.wait_closed()
        intake.flush()
        outbox.flush()
        writer.close()
        regulator.stop()
        os.close(tokens)
    out, _ = await loop.run_in_executor(None, helper.communicate)
    return used / args.m, out.strip()


def main(argv: Sequence[str] | None = None) -> int:
    """Parse the arguments, run the rounds, print a line each."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    parser.add_argument("-m", type=int, default=2000, help="sessions (messages) per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dir", default=None, help="where the spool goes (default: temp dir)")
    parser.add_argument("--source", default=SOURCE, help="the smtp-source program")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per round at most")
    parser.add_argument("--keep-log", default=None, help="copy the maillog file here at the end")
    parser.add_argument("--drain", nargs=2, metavar=("FD", "SPOOL"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.drain:
        return drain(int(args.drain[0]), args.drain[1])
    root = Path(tempfile.mkdtemp(prefix="sessionpath-", dir=args.dir))
    try:
        cfg = _config(root)
        output = open_log_output(cfg)
        try:
            spool = Spool(root / "spool")
            spool.ensure_dirs()
            print(f"loadavg={os.getloadavg()[0]:.1f} sessions={args.m} dir={root.parent}")
            for r in range(1, args.rounds + 1):
                with asyncio.Runner(loop_factory=loop_factory()) as runner:
                    per, seen = runner.run(run_round(cfg, spool, args))
                print(
                    f"round={r} sessions={args.m} committed={seen} "
                    f"cpu={per * 1000:.3f} ms/session"
                )
            with (root / "maillog").open("rb") as log:
                print(f"maillog lines={sum(1 for _ in log)}")
            if args.keep_log:
                shutil.copy(root / "maillog", args.keep_log)
        finally:
            output.close()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
