"""The queue manager's delivery side alone: drain a pre-filled incoming queue to smtp-sink.

    .venv/bin/python bench/qmgr_drain.py                          # 1k10r: 3000 x 1 KB, 10 rcpts
    .venv/bin/python bench/qmgr_drain.py --shape 1k10r10d -n 2000
    .venv/bin/python bench/qmgr_drain.py --shape 1k --rounds 5
    .venv/bin/python bench/qmgr_drain.py --repo ../main --repo .   # A/B, alternated

``postfix_bench.py`` measures the whole relay, whose listener processes and
smtp-source share the machine's cores with the queue manager, so the queue
manager's CPU per message swings with their contention. This bench leaves the
listener out: it commits N messages straight into a fresh spool's
``incoming/`` (``Spool.commit``), starts ``python -m qmgrd run`` on it
(``smtpd_worker_processes = 0``, no client connects), relays everything to
``smtp-sink`` processes (one per destination, ``transport_maps`` for
``1k10r10d``, as in ``postfix_bench.py``), and follows the log until every
recipient has its ``status=sent`` line and every message its ``removed``.

Printed per run: messages/s and the queue manager's CPU milliseconds per
message (user + system from /proc, counted from the first ``status=sent``
line to the last, so start-up is left out), then per shape the median and
min-max over rounds. It loads, delivers (agents in process), records done
marks and log lines, and finishes each message: the whole delivery side.
A benchmark prints; nothing is asserted.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.postfix_bench import SHAPES, Shape, free_port, tool, transport_map, wait_port
from bench.procwatch import sample
from qmgrd.spool import Envelope, RecipientSpec, Spool

REPO = Path(__file__).resolve().parents[1]


def _cpu_seconds(pid: int) -> float:
    found = sample(pid)
    if found is None:
        raise RuntimeError(f"the daemon (pid {pid}) has gone")
    return found.cpu


def _content(size: int) -> bytes:
    head = b"From: a@src.bench\r\nTo: b@dst.bench\r\nSubject: drain\r\n\r\n"
    line = b"x" * 70 + b"\r\n"
    return head + line * max(1, (size - len(head)) // len(line))


def _fill(spool: Spool, shape: Shape, n: int) -> None:
    rcpts = tuple(RecipientSpec(f"{i}to@dst.bench") for i in range(1, shape.rcpts + 1))
    body = _content(shape.size)
    now = time.time()
    batch = [(Envelope("from@src.bench", rcpts, now), body)] * 100
    for _ in range(n // 100):
        for result in spool.commit_batch(batch):
            if not isinstance(result, str):
                raise result
    for _ in range(n % 100):
        spool.commit(batch[0][0], body)


def run_once(
    shape: Shape, n: int, sink_tool: str, timeout: float, repo: Path = REPO
) -> tuple[float, float]:
    """(messages/s, queue manager CPU ms per message) of one drain of ``repo``'s qmgrd."""
    root = Path(tempfile.mkdtemp(prefix="qmgr-drain-"))
    procs: list[subprocess.Popen[bytes]] = []
    try:
        sinks = [free_port() for _ in range(shape.dests)]
        as_root = ["-u", "nobody"] if os.geteuid() == 0 else []  # smtp-sink refuses root
        for port in sinks:
            procs.append(
                subprocess.Popen(
                    [sink_tool, *as_root, f"127.0.0.1:{port}", "256"],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            )
        for port in sinks:
            wait_port(port, 30)
        spool = Spool(root / "spool", fsync=False)
        spool.ensure_dirs()
        _fill(spool, shape, n)
        conf = root / "etc"
        conf.mkdir()
        extra = ""
        if shape.dests > 1:
            transport_map(conf / "transport", sinks)
            extra = f"transport_maps = texthash:{conf / 'transport'}\n"
        (conf / "main.cf").write_text(
            f"queue_directory = {root / 'spool'}\n"
            f"smtpd_listen = 127.0.0.1:{free_port()}\n"
            "smtpd_worker_processes = 0\n"
            "myhostname = relay.bench\n"
            "mynetworks = 127.0.0.0/8\n"
            f"relayhost = [127.0.0.1]:{sinks[0]}\n"
            f"maillog_file = {root / 'maillog'}\n" + extra
        )
        (conf / "master.cf").write_text((repo / "config" / "master.cf").read_text())
        daemon = subprocess.Popen(
            [sys.executable, "-m", "qmgrd", "-c", str(conf), "run"],
            cwd=str(repo),  # -m: the checkout's qmgrd package comes first
            stdout=subprocess.DEVNULL,
            stderr=(root / "stderr").open("wb"),
        )
        procs.append(daemon)
        want_sent, want_removed = n * shape.rcpts, n
        sent = removed = 0
        first: tuple[float, float, int] | None = None
        deadline = time.monotonic() + timeout
        log = root / "maillog"
        pos = 0
        while sent < want_sent or removed < want_removed:
            if time.monotonic() > deadline or daemon.poll() is not None:
                raise RuntimeError(f"drain incomplete: {sent} sent, {removed} removed")
            time.sleep(0.005)
            if not log.exists():
                continue
            with log.open("rb") as f:
                f.seek(pos)
                chunk = f.read()
            cut = chunk.rfind(b"\n") + 1
            pos += cut
            lines = chunk[:cut]
            got = lines.count(b"status=sent")
            if got and first is None:
                first = (time.monotonic(), _cpu_seconds(daemon.pid), sent + got)
            sent += got
            removed += lines.count(b": removed")
        end_time, end_cpu = time.monotonic(), _cpu_seconds(daemon.pid)
        assert first is not None
        t0, cpu0, counted = first
        messages = (want_sent - counted) / shape.rcpts
        return messages / (end_time - t0), 1000 * (end_cpu - cpu0) / messages
    finally:
        for proc in reversed(procs):
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
        shutil.rmtree(root, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="1k10r", help="comma list of " + ", ".join(SHAPES))
    parser.add_argument("-n", type=int, default=3000, help="messages per run")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per run")
    parser.add_argument(
        "--repo",
        action="append",
        type=Path,
        help="run the qmgrd of this checkout (repeatable: the checkouts alternate, A/B)",
    )
    args = parser.parse_args()
    repos: list[Path] = args.repo or [REPO]
    sink = tool("smtp-sink")
    if not sink:
        print("smtp-sink not found: apt-get install postfix", file=sys.stderr)
        return 2
    for name in args.shape.split(","):
        shape = SHAPES[name]
        rates: dict[Path, list[float]] = {repo: [] for repo in repos}
        cpus: dict[Path, list[float]] = {repo: [] for repo in repos}
        for number in range(1, args.rounds + 1):
            for repo in repos:
                rate, cpu = run_once(shape, args.n, sink, args.timeout, repo)
                rates[repo].append(rate)
                cpus[repo].append(cpu)
                load = os.getloadavg()[0]
                print(
                    f"{name:9} {repo.name:10} round={number} {rate:6.0f} msg/s  "
                    f"qmgr cpu {cpu:.3f} ms/msg  load={load:.1f}",
                    flush=True,
                )
        for repo in repos:
            r, c = rates[repo], cpus[repo]
            print(
                f"{name:9} {repo.name:10} median {statistics.median(r):.0f} msg/s "
                f"({min(r):.0f}-{max(r):.0f}), qmgr cpu {statistics.median(c):.3f} ms/msg "
                f"({min(c):.3f}-{max(c):.3f})"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
