"""The listener's own Python path per message, without sockets: CPU ms/msg of Session + commit.

    .venv/bin/python bench/intakepath.py                    # 1 KB and 100 KB, 2000 messages each
    .venv/bin/python bench/intakepath.py --sizes 100 -m 500 --dir /dev/shm
    .venv/bin/python bench/intakepath.py --remove unlink   # delivered files deleted, not pooled
    .venv/bin/python bench/intakepath.py --body xlines     # smtp-source -l's body (no dots)

Each message is one scripted session (EHLO, MAIL, RCPT, DATA with headers as
smtp-source sends them and a body in 64 KiB reads, QUIT; the body is ``text``,
smtp-source's "La de da de da 1." lines without ``-l``, a dot every 18 bytes, or
``xlines``, what ``smtp-source -l SIZE`` sends: 80-byte lines of a digit and
"X"s, no dot) through the real
``Session``, ``Channel``, cleanup, queue-file writer and group commit (fsync
on), with the daemon's settings for a bench main.cf, on uvloop, 20 sessions
at a time. The client is a ``Channel`` whose every reply write delivers the
next scripted piece, so there is no socket, no client process and no kernel
TCP path: what is measured is this process's CPU (``time.process_time``) per
message, mostly the listener's Python. The spool and maillog live under
``--dir`` (default: the system's temporary directory); on tmpfs the file
system's share is small. ``--remove`` plays the queue manager's part once a
message is ``LAG`` commits old: ``recycle`` (the daemon's: ``spool.recycle.retire``,
so later temporary files reuse the inodes), ``unlink`` (delete, as before the
pool) or ``keep``; the CPU of that removal (on the loop's thread) is not
counted. Prints one line per size; never asserts anything.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import sys
import tempfile
import time
from collections import deque
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from qmgrd.cleanup import CleanupSettings
from qmgrd.config import load_config
from qmgrd.daemon.process import loop_factory, open_log_output
from qmgrd.listener.auth import PasswordChecker
from qmgrd.listener.channel import Channel
from qmgrd.listener.limits import ClientCounters
from qmgrd.listener.observer import Committed
from qmgrd.listener.services import listener_settings
from qmgrd.listener.session import ListenerContext, Session
from qmgrd.listener.settings import ListenerSettings
from qmgrd.spool import GroupCommitter, Spool
from qmgrd.spool.recycle import Recycler, retire

REPO = Path(__file__).resolve().parents[1]
PARALLEL = 20
LAG = 200  # commits between a message's commit and its removal (--remove)
READ = 65536
_LINE = b"La de da de da 1. La de da de da 2. La de da de da 3. La de da de da 4.\r\n"


def script(size: int, body_shape: str = "text") -> list[bytes]:
    """What the client sends, one piece per reply it waits for (the body in reads)."""
    head = (
        b"From: <a@src.bench>\r\nTo: <to@dst.bench>\r\n"
        b"Date: Thu, 26 Nov 2026 07:00:00 +0000\r\nMessage-Id: <1.2.3@src.bench>\r\n\r\n"
    )
    body = (_LINE * (size // len(_LINE) + 1))[:size] if body_shape == "text" else _xlines(size)
    message = head + body + (b"" if body.endswith(b"\r\n") else b"\r\n") + b".\r\n"
    data = [message[i : i + READ] for i in range(0, len(message), READ)]
    mail = [b"MAIL FROM:<a@src.bench>\r\n", b"RCPT TO:<to@dst.bench>\r\n"]
    return [b"EHLO src.bench\r\n", *mail, b"DATA\r\n", *data, b"QUIT\r\n"]


def _xlines(size: int) -> bytes:
    """smtp-source -l's body: 80-byte lines of a digit and "X"s, no dot anywhere."""
    lines = [b"%d" % (i % 10) + b"X" * 77 + b"\r\n" for i in range(1, size // 80 + 2)]
    return b"".join(lines)[:size]


class ScriptedClient(Channel):
    """A channel without a transport: each reply write delivers the client's next piece."""

    def __init__(self, pieces: Sequence[bytes]) -> None:
        super().__init__(1 << 20)
        self._pieces = list(reversed(pieces))

    def write(self, data: bytes) -> int:
        if data.startswith(b"354"):  # DATA: the client sends the whole message
            while len(self._pieces) > 1:
                self.data_received(self._pieces.pop())
        elif self._pieces:
            self.data_received(self._pieces.pop())
        else:
            self.eof_received()
        return 0  # nothing waits to be sent


class Remover:
    """The queue manager's removal of delivered files, ``LAG`` commits late (module doc)."""

    def __init__(self, spool: Spool, how: str, size: int) -> None:
        self.spool, self.how, self.size = spool, how, size
        self.waiting: deque[str] = deque()
        self.cpu = 0.0  # this thread's CPU spent removing (not the listener's)

    def committed(self, c: Committed) -> None:
        if self.how == "keep":
            return
        self.waiting.append(c.queue_id)
        if len(self.waiting) > LAG:
            self.remove(self.waiting.popleft())

    def remove(self, queue_id: str) -> None:
        start = time.thread_time()
        if self.how == "recycle":
            retire(str(self.spool.root), "incoming", queue_id, self.size)
        else:
            self.spool.remove("incoming", queue_id)
        self.cpu += time.thread_time() - start


async def run_size(
    settings: ListenerSettings, spool: Spool, size: int, count: int, remove: str, body: str
) -> float:
    """CPU seconds per message for ``count`` sessions of a ``size``-byte message."""
    committer = GroupCommitter(spool)
    remover = Remover(spool, remove, size)
    ctx = ListenerContext(
        committer=committer,
        on_commit=remover.committed,
        clock=time.time,
        counters=ClientCounters(),
        passwords=PasswordChecker(),
        recycler=Recycler(str(spool.root)),
    )
    pieces = script(size, body)

    async def one() -> None:
        await Session(ScriptedClient(pieces), settings, ctx, "127.0.0.1").run()

    start = time.process_time()
    done = 0
    while done < count:
        batch = min(PARALLEL, count - done)
        await asyncio.gather(*(one() for _ in range(batch)))
        done += batch
    await committer.close()
    return (time.process_time() - start - remover.cpu) / count


def main(argv: Sequence[str] | None = None) -> int:
    """Parse the arguments, run each size, print a line each."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="1,100", help="message sizes in KB (comma list)")
    parser.add_argument("-m", type=int, default=2000, help="messages per size")
    parser.add_argument("--dir", default=None, help="where the spool goes (default: temp dir)")
    parser.add_argument(
        "--remove",
        choices=("recycle", "unlink", "keep"),
        default="recycle",
        help="what becomes of a committed message LAG commits later (module doc)",
    )
    parser.add_argument(
        "--body",
        choices=("text", "xlines"),
        default="text",
        help='text: "La de da" lines (a dot every 18 bytes); xlines: smtp-source -l\'s (no dot)',
    )
    args = parser.parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="intakepath-", dir=args.dir))
    try:
        conf = root / "etc"
        conf.mkdir()
        (conf / "main.cf").write_text(
            f"queue_directory = {root / 'spool'}\nsmtpd_listen = 127.0.0.1:2525\n"
            "myhostname = relay.bench\nmynetworks = 127.0.0.0/8\n"
            f"relayhost = [127.0.0.1]:2526\nmaillog_file = {root / 'maillog'}\n"
        )
        shutil.copy(REPO / "config" / "master.cf", conf / "master.cf")
        cfg = load_config(conf)
        output = open_log_output(cfg)
        try:
            settings = listener_settings(cfg, cleanup=CleanupSettings.from_config(cfg))[0]
            spool = Spool(root / "spool")
            spool.ensure_dirs()
            for size_kb in (int(s) for s in args.sizes.split(",")):
                before = len(spool.list_ids("incoming"))
                with asyncio.Runner(loop_factory=loop_factory()) as runner:
                    per = runner.run(
                        run_size(settings, spool, size_kb * 1024, args.m, args.remove, args.body)
                    )
                queued = len(spool.list_ids("incoming")) - before
                print(
                    f"size={size_kb:>4}KB messages={args.m:>6} queued={queued:>6} "
                    f"cpu={per * 1000:.3f} ms/msg remove={args.remove} dir={root.parent}"
                )
        finally:
            output.close()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
