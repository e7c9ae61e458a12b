"""Relay throughput end to end: SMTP in, through the spool and the queue manager, SMTP out.

    .venv/bin/python bench/throughput.py                    # 5,000 x 1 KB, 20 clients, both loops
    .venv/bin/python bench/throughput.py -n 20000 -c 20 --loop uvloop
    .venv/bin/python bench/throughput.py --rcpts 5          # 5 recipients per message
    .venv/bin/python bench/throughput.py --profile prof.out # cProfile the daemon, print top costs

For each event loop (uvloop, then plain asyncio) it:

1. starts ``bench/sinkproc.py`` (a lean SMTP sink) in its own process;
2. starts the daemon in a child process: the same ``qmgrd.daemon.run.serve``
   that ``qmgrd run`` uses, with a fresh spool in a temporary directory, fsync
   on (``--no-fsync`` to compare), ``relayhost = [127.0.0.1]:<sink>``, default
   scheduler settings and Postfix-format logging to a pipe;
3. injects N messages of ``--size`` bytes and ``--rcpts`` recipients from C
   concurrent SMTP sessions (lean pipelining clients in this process);
4. reads the daemon's log until it has logged ``status=sent`` for every
   recipient and ``removed`` for every message.

It prints messages/s and recipients/s end to end (first byte sent to the
listener until the last ``status=sent`` line), the intake time alone, and CPU
milliseconds per message of the daemon (from /proc, user + system), of the sink
and of the injecting clients. The comparison point: Postfix 3.7 relays 1 KB
single-recipient mail from 20 injecting sessions to a loopback sink at about
550 messages/s with 2.6 ms of CPU per message on this class of machine.
Nothing is asserted; the sink's counters are checked against what was sent.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TIMEOUT = 600.0


# ---------------------------------------------------------------------- daemon child


def _daemon(conf: str, loop_kind: str, profile: str | None) -> None:
    """Child process: run the daemon as ``qmgrd run`` does, on the chosen loop, until SIGTERM."""
    sys.path.insert(0, str(REPO))
    from qmgrd.config import load_config
    from qmgrd.daemon.run import serve
    from qmgrd.log import configure_logging

    cfg = load_config(Path(conf))
    configure_logging("postfix")

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop.set)
        await serve(cfg, stop=stop)

    profiler = None
    if profile:
        import cProfile

        # CPU time of the loop thread (worker threads do the file work and are not profiled).
        profiler = cProfile.Profile(time.thread_time)
        profiler.enable()
    if loop_kind == "uvloop":
        import uvloop

        uvloop.run(main())
    else:
        asyncio.run(main())
    if profiler is not None and profile:
        profiler.disable()
        profiler.dump_stats(profile)


# ---------------------------------------------------------------------- parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _message(size: int) -> bytes:
    head = b"From: a@bench.test\r\nTo: b@bench.test\r\nSubject: bench\r\n\r\n"
    line = b"x" * 76 + b"\r\n"
    body = line * max(1, (size - len(head)) // len(line))
    return head + body


@dataclass(slots=True)
class LogWatch:
    """Counts the daemon's outcome lines from its stdout (a reader thread)."""

    want_sent: int
    want_removed: int
    sent: int = 0
    removed: int = 0
    problems: int = 0
    last_sent: float = 0.0
    first_problem: str = ""
    done: threading.Event = field(default_factory=threading.Event)
    started: threading.Event = field(default_factory=threading.Event)

    def follow(self, stream: object) -> None:
        """Read lines until EOF; set ``done`` when every recipient and message is accounted."""
        for raw in stream:  # type: ignore[attr-defined]
            line = raw.decode(errors="replace") if isinstance(raw, bytes) else raw
            if "status=sent" in line:
                self.sent += 1
                if self.sent == self.want_sent:
                    self.last_sent = time.perf_counter()
            elif ": removed" in line:
                self.removed += 1
            elif "daemon started" in line:
                self.started.set()
            elif "status=deferred" in line or "status=bounced" in line or "error" in line:
                self.problems += 1
                self.first_problem = self.first_problem or line.strip()
            if self.sent >= self.want_sent and self.removed >= self.want_removed:
                self.done.set()
        self.started.set()
        self.done.set()


async def _client(port: int, jobs: list[bytes], content: bytes) -> None:
    """One injecting session: pipelined MAIL/RCPT/DATA, one write for the content."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    await reader.readline()
    writer.write(b"EHLO bench.test\r\n")
    while not (await reader.readline()).startswith(b"250 "):
        pass
    for envelope in jobs:
        writer.write(envelope)
        replies = envelope.count(b"\r\n")
        reply = b""
        for _ in range(replies):
            reply = await reader.readline()
            if reply[:1] not in (b"2", b"3"):
                raise RuntimeError(f"injection refused: {reply!r}")
        if not reply.startswith(b"354"):
            raise RuntimeError(f"unexpected reply {reply!r}")
        writer.write(content)
        reply = await reader.readline()
        if not reply.startswith(b"250"):
            raise RuntimeError(f"not accepted: {reply!r}")
    writer.write(b"QUIT\r\n")
    await reader.readline()
    writer.close()


def _envelopes(n: int, rcpts: int) -> list[bytes]:
    out = []
    for i in range(n):
        lines = [b"MAIL FROM:<a@bench.test>\r\n"]
        lines += [f"RCPT TO:<m{i}r{j}@dst.bench>\r\n".encode() for j in range(rcpts)]
        lines.append(b"DATA\r\n")
        out.append(b"".join(lines))
    return out


async def _inject(port: int, n: int, clients: int, rcpts: int, content: bytes) -> None:
    envelopes = _envelopes(n, rcpts)
    shares = [envelopes[i::clients] for i in range(clients)]
    await asyncio.gather(*(_client(port, share, content + b".\r\n") for share in shares if share))


def _write_config(root: Path, port: int, sink_port: int, extra: str) -> Path:
    conf = root / "etc"
    conf.mkdir()
    (conf / "main.cf").write_text(
        f"queue_directory = {root / 'spool'}\n"
        f"smtpd_listen = 127.0.0.1:{port}\n"
        "myhostname = bench.test\n"
        "mynetworks = 127.0.0.0/8\n"
        f"relayhost = [127.0.0.1]:{sink_port}\n"
        f"{extra}\n"
    )
    (conf / "master.cf").write_text((REPO / "config" / "master.cf").read_text())
    return conf


@dataclass(slots=True)
class Result:
    """One run's numbers."""

    loop: str
    messages: int
    recipients: int
    elapsed: float
    intake: float
    daemon_cpu: float
    sink_cpu: float
    client_cpu: float
    connections: int
    problems: int

    def line(self) -> str:
        """One human-readable line."""
        n = self.messages
        return (
            f"loop={self.loop:<7} messages={n} recipients={self.recipients} "
            f"rate={n / self.elapsed:7.0f} msg/s {self.recipients / self.elapsed:7.0f} rcpt/s  "
            f"daemon_cpu={self.daemon_cpu * 1000 / n:6.3f} ms/msg  "
            f"sink_cpu={self.sink_cpu * 1000 / n:5.3f}  "
            f"client_cpu={self.client_cpu * 1000 / n:5.3f}  "
            f"wall={self.elapsed:6.2f}s intake={self.intake:6.2f}s "
            f"sink_connections={self.connections} problems={self.problems}"
        )


def run_once(args: argparse.Namespace, loop_kind: str) -> Result:
    """Sink, daemon, injection, wait for the log, stop; returns the numbers."""
    root = Path(tempfile.mkdtemp(prefix="qmgrd-throughput-"))
    sink = subprocess.Popen(
        [sys.executable, str(REPO / "bench" / "sinkproc.py")],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    daemon: subprocess.Popen[bytes] | None = None
    try:
        assert sink.stdout is not None and sink.stdin is not None
        sink_port = int(sink.stdout.readline())
        port = _free_port()
        conf = _write_config(root, port, sink_port, args.main_cf)
        cmd = [sys.executable, __file__, "--daemon", str(conf), "--loop", loop_kind]
        if args.no_fsync:
            cmd.append("--no-fsync")
        if args.profile:
            cmd += ["--profile", f"{args.profile}.{loop_kind}"]
        daemon = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=str(REPO)
        )
        watch = LogWatch(want_sent=args.n * args.rcpts, want_removed=args.n)
        reader = threading.Thread(target=watch.follow, args=(daemon.stdout,), daemon=True)
        reader.start()
        if not watch.started.wait(60) or daemon.poll() is not None:
            raise RuntimeError("the daemon did not start")
        content = _message(args.size)
        cpu0 = _cpu_seconds(daemon.pid)
        self0 = time.process_time()
        t0 = time.perf_counter()
        asyncio.run(_inject(port, args.n, args.clients, args.rcpts, content))
        intake = time.perf_counter() - t0
        client_cpu = time.process_time() - self0
        if not watch.done.wait(TIMEOUT):
            raise RuntimeError(f"not all delivered: sent={watch.sent} removed={watch.removed}")
        daemon_cpu = _cpu_seconds(daemon.pid) - cpu0
        elapsed = watch.last_sent - t0
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(60)
        sink.stdin.close()
        stats = json.loads(sink.stdout.readline())
        sink.wait(30)
        if stats["recipients"] != args.n * args.rcpts:
            raise RuntimeError(f"sink counted {stats} for {args.n} x {args.rcpts}")
        return Result(
            loop=loop_kind,
            messages=args.n,
            recipients=args.n * args.rcpts,
            elapsed=elapsed,
            intake=intake,
            daemon_cpu=daemon_cpu,
            sink_cpu=float(stats["cpu_s"]),
            client_cpu=client_cpu,
            connections=int(stats["connections"]),
            problems=watch.problems,
        )
    finally:
        for proc in (daemon, sink):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait(30)
        shutil.rmtree(root, ignore_errors=True)


def _print_profile(path: str, top: int) -> None:
    import pstats

    print(f"--- cProfile of the daemon ({path}), top {top} by own time")
    stats = pstats.Stats(path)
    stats.sort_stats("tottime").print_stats(top)


def main() -> None:
    """Parse arguments and run each requested loop."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=5000, help="messages to relay")
    parser.add_argument("-c", "--clients", type=int, default=20, help="injecting sessions")
    parser.add_argument("--size", type=int, default=1024, help="message size in bytes")
    parser.add_argument("--rcpts", type=int, default=1, help="recipients per message")
    parser.add_argument("--loop", choices=("both", "uvloop", "asyncio"), default="both")
    parser.add_argument("--no-fsync", action="store_true", help="spool without fsync")
    parser.add_argument("--main-cf", default="", help="extra main.cf lines (use \\n)")
    parser.add_argument("--profile", help="cProfile the daemon into PROFILE.<loop>")
    parser.add_argument("--top", type=int, default=25, help="profile lines to print")
    parser.add_argument("--daemon", help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.main_cf = args.main_cf.replace("\\n", "\n")
    if args.daemon:
        if args.no_fsync:
            _patch_no_fsync()
        _daemon(args.daemon, args.loop, args.profile)
        return
    loops = ("uvloop", "asyncio") if args.loop == "both" else (args.loop,)
    print(
        f"cpus={os.cpu_count()} n={args.n} clients={args.clients} size={args.size} "
        f"rcpts={args.rcpts} fsync={'off' if args.no_fsync else 'on'}",
        flush=True,
    )
    for loop_kind in loops:
        print(run_once(args, loop_kind).line(), flush=True)
        if args.profile:
            _print_profile(f"{args.profile}.{loop_kind}", args.top)


def _patch_no_fsync() -> None:
    """``--no-fsync``: the daemon's spool skips fsync (``Spool(fsync=False)``)."""
    from qmgrd import spool as spool_pkg

    original = spool_pkg.Spool.__init__

    def init(self: spool_pkg.Spool, root: Path, *, fsync: bool = True, ids: object = None) -> None:
        original(self, root, fsync=False, ids=ids)  # type: ignore[arg-type]

    spool_pkg.Spool.__init__ = init  # type: ignore[method-assign]


if __name__ == "__main__":
    main()
