"""Where the start-of-load excess goes: back-to-back loads against one running relay.

    .venv/bin/python bench/warmup.py -m 1500 --loads 3 --window 0.5

Starts smtp-sink and one qmgrd (``bench/postfix_bench.py``'s set-up: same
main.cf, ``--smtpd-workers`` as there), then runs ``smtp-source -s 20 -m M -l
1024`` ``--loads`` times in a row against that same relay, each load waiting
for its last ``status=sent`` line, with ``--pause`` seconds between loads.

Printed per load: msg/s and CPU ms per message of each relay process (queue
manager ``qm``, listener workers ``w1``, ``w2``... by pid order, delivery
workers by name). If the second load costs as much as the first, the excess
is not a warm-up inside the relay (it would then come from the run's own
shape: its start, its tail, the disk); if it costs less, something the relay
builds or learns while under load is the cause.

With ``--window S`` each load also prints a time series: per window of ``S``
seconds, the messages sent in it and each process's CPU ms per message sent
(the queue manager) or per window (every process, ``cpu%``). A benchmark
prints; nothing is asserted.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.postfix_bench import SHAPES, LogTail, Qmgrd, free_port, tool, wait_port
from bench.procwatch import descendants

_TICK = os.sysconf("SC_CLK_TCK")


def _cpus(roots: list[int]) -> dict[int, tuple[str, float, float]]:
    """Name, user and kernel CPU seconds per process of the tree."""
    out: dict[int, tuple[str, float, float]] = {}
    for pid in descendants(roots):
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except (FileNotFoundError, ProcessLookupError):
            continue
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        fields = stat.rsplit(")", 1)[1].split()
        out[pid] = (name, int(fields[11]) / _TICK, int(fields[12]) / _TICK)
    return out


def _delta(
    now: dict[int, tuple[str, float, float]], then: dict[int, tuple[str, float, float]]
) -> dict[int, tuple[float, float]]:
    """User and kernel seconds per process between two ``_cpus``."""
    out = {}
    for pid, (name, user, kern) in now.items():
        _, user0, kern0 = then.get(pid, (name, user, kern))
        out[pid] = (user - user0, kern - kern0)
    return out


def _labels(cpus: dict[int, tuple[str, float, float]], root: int) -> dict[int, str]:
    labels = {root: "qm"}
    n = 0
    for pid in sorted(cpus):
        if pid == root:
            continue
        name = cpus[pid][0]
        if "smtpd" in name:
            n += 1
            labels[pid] = f"w{n}"
        else:
            labels[pid] = f"{name}:{pid}"
    return labels


Cpu = dict[int, tuple[float, float]]  # pid -> user, kernel seconds


def _load(
    args: argparse.Namespace, m: int, port: int, log: Path, root: int, source: str
) -> tuple[float, Cpu, list[tuple[int, Cpu]]]:
    """One smtp-source run: elapsed, CPU per pid, and the windows (sent, CPU per pid)."""
    tail = LogTail(log, want=m)
    threading.Thread(target=tail.follow, daemon=True).start()
    time.sleep(0.05)  # the tail has found the file's end
    base = _cpus([root])
    windows: list[tuple[int, Cpu]] = []
    cmd = [source, "-s", "20", "-m", str(m), "-l", "1024", "-f", "a@src.bench"]
    cmd += ["-t", "to@dst.bench", "-M", "src.bench", f"127.0.0.1:{port}"]
    counters = _perf_start(args.perf, list(base)) if args.perf else []
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    last, last_sent = base, 0
    deadline = t0 + args.timeout
    while not tail.done.is_set() and time.perf_counter() < deadline:
        if args.every:  # a window per ``every`` messages sent
            tail.done.wait(0.005)
            if tail.sent - last_sent < args.every and not tail.done.is_set():
                continue
        else:
            tail.done.wait(args.window or 0.5)
        now = _cpus([root])
        sent = tail.sent
        windows.append((sent - last_sent, _delta(now, last)))
        last, last_sent = now, sent
    proc.wait(30)
    tail.stop.set()
    if counters:
        _perf_print(counters, _labels(_cpus([root]), root))
    elapsed = tail.last_sent - t0 if tail.done.is_set() else float("nan")
    return elapsed, _delta(_cpus([root]), base), windows


def _perf_start(events: str, pids: list[int]) -> list[tuple[int, subprocess.Popen[bytes]]]:
    """``perf stat -e events`` on each process (counts of kernel tracepoints: cheap)."""
    return [
        (
            pid,
            subprocess.Popen(
                ["perf", "stat", "-x", ",", "-e", events, "-p", str(pid)],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
            ),
        )
        for pid in pids
    ]


def _perf_print(
    counters: list[tuple[int, subprocess.Popen[bytes]]], labels: dict[int, str]
) -> None:
    """Stop the ``perf stat`` runs and print their counts per process."""
    for _pid, perf in counters:
        perf.send_signal(signal.SIGINT)
    for pid, perf in counters:
        _, err = perf.communicate(timeout=30)
        counts = []
        for line in err.decode(errors="replace").splitlines():
            fields = line.split(",")
            if len(fields) > 2 and fields[2]:
                counts.append(f"{fields[2].split(':')[-1]}={fields[0]}")
        print(f"  perf {labels.get(pid, str(pid))}: {' '.join(counts)}")


def _cells(cpu: Cpu, labels: dict[int, str], scale: float, fmt: str) -> str:
    return " ".join(
        f"{labels.get(p, str(p))}={fmt.format(u * scale)}+{fmt.format(k * scale)}"
        for p, (u, k) in sorted(cpu.items())
    )


def _relay_once(args: argparse.Namespace, source: str, sink_tool: str) -> None:
    root = Path(tempfile.mkdtemp(prefix="bench-warmup-"))
    sink_port = free_port()
    as_root = ["-u", "nobody"] if os.geteuid() == 0 else []
    sink = subprocess.Popen(
        [sink_tool, *as_root, f"127.0.0.1:{sink_port}", "256"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    relay = Qmgrd(args.smtpd_workers, args.qmgrd_main)
    try:
        wait_port(sink_port, 30, sink)
        port = free_port()
        relay.start(root, port, [sink_port], SHAPES["1k"])
        qm = relay.roots()[0]
        time.sleep(1.0)
        sizes = [int(word) for word in str(args.m).split(",")]
        for n in range(1, args.loads + 1):
            m = sizes[(n - 1) % len(sizes)]
            elapsed, used, windows = _load(args, m, port, relay.log, qm, source)
            labels = _labels(_cpus([qm]), qm)
            user = sum(u for u, _ in used.values())
            kern = sum(k for _, k in used.values())
            print(
                f"load {n}: m={m} {m / elapsed:6.0f} msg/s  cpu ms/msg "
                f"{(user + kern) * 1000 / m:.2f} (user {user * 1000 / m:.2f} "
                f"sys {kern * 1000 / m:.2f}) "
                f"[{_cells(used, labels, 1000 / m, '{:.2f}')}]  "
                f"loadavg={os.getloadavg()[0]:.1f}",
                flush=True,
            )
            if args.window or args.every:
                done = 0
                for i, (sent, cpu) in enumerate(windows):
                    total = sum(u + k for u, k in cpu.values())
                    per_msg = total * 1000 / sent if sent else float("nan")
                    at = f"n={done:5d}" if args.every else f"t={i * args.window:5.1f}"
                    done += sent
                    print(
                        f"  {at} sent={sent:5d} {per_msg:5.2f} ms/msg"
                        f"  cpu ms user+sys: {_cells(cpu, labels, 1000, '{:.0f}')}"
                    )
            time.sleep(args.pause)
    finally:
        relay.stop()
        sink.kill()
        sink.wait(10)
        shutil.rmtree(root, ignore_errors=True)


def main() -> int:
    """Start the relay ``--starts`` times, run the loads against each, print."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument(
        "-m", default="1500", help="messages per load; a comma list: one after another, cycled"
    )
    parser.add_argument("--loads", type=int, default=3, help="loads per relay start")
    parser.add_argument("--starts", type=int, default=1, help="fresh relays, one after another")
    parser.add_argument("--pause", type=float, default=2.0, help="seconds between loads")
    parser.add_argument("--window", type=float, default=0.0, help="time series window (0: none)")
    parser.add_argument(
        "--every", type=int, default=0, help="a window per N messages sent (instead of --window)"
    )
    parser.add_argument(
        "--perf",
        default="",
        help="perf stat events counted per process and load, e.g. "
        "ext4:ext4_allocate_inode,ext4:ext4_free_inode (root)",
    )
    parser.add_argument("--smtpd-workers", default="2")
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument("--qmgrd-main", action="append", default=[], metavar="LINE")
    args = parser.parse_args()
    source, sink_tool = tool("smtp-source"), tool("smtp-sink")
    if not source or not sink_tool:
        print("smtp-source/smtp-sink not found: apt-get install postfix", file=sys.stderr)
        return 2
    print(f"loadavg={os.getloadavg()[0]:.1f} m={args.m} loads={args.loads}", flush=True)
    for n in range(1, args.starts + 1):
        print(f"relay start {n}", flush=True)
        _relay_once(args, source, sink_tool)
    return 0


if __name__ == "__main__":
    sys.exit(main())
