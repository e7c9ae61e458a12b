"""Overload without collapse: the relay at 3x its capacity, measured from outside.

    .venv/bin/python bench/overload.py                      # 15 s peak, then 60 s at 3x
    .venv/bin/python bench/overload.py --peak 10 --duration 20 --factor 3
    .venv/bin/python bench/overload.py --main-cf 'in_flow_lag_limit = 0' \
        --main-cf 'in_flow_backlog_limit = 0'                            # regulation off
    .venv/bin/python bench/overload.py --smtpd-workers 2               # 2 listener workers

qmgrd runs as ``python -m qmgrd run`` (a temporary spool, main.cf defaults
plus ``REGULATED``: ``in_flow_lag_limit = 50`` and ``in_flow_backlog_limit =
1000``, off by default; then the ``--main-cf`` lines, a later line overriding
an earlier one; ``metrics_listen`` on loopback) relaying to
``bench/sinkproc.py``. The generator and the sink run at nice 10: they
stand for other machines and should not take the relay's CPU on a small
box. A load generator in its own process (``bench/overloadgen.py``) sends 1 KB
messages with one recipient, a new SMTP session per message (smtp-source's
shape), in two phases:

1. peak: closed loop, ``--sessions`` sessions in parallel for ``--peak``
   seconds; the relay's rate (recipients delivered per second, from its
   ``qmgrd_deliveries_total{status="sent"}`` counter, the first quarter of
   the phase left out as warm-up) is its capacity;
2. overload: open loop, new sessions started at ``--factor`` x that rate for
   ``--duration`` seconds whatever the relay does (at most ``--outstanding``
   at once: beyond that a session is counted as ``capped``, not started).

Printed: the peak rate; the delivered rate under overload and its ratio to
the peak; the relay's event-loop lag p50/p99 at peak and during the overload (from its
``qmgrd_event_loop_lag_seconds`` histogram, interpolated within buckets);
the relay's CPU use in both phases (share of a core, CPU ms per delivered
message: tells a relay that got less CPU from one that wasted it; the queue
manager's and the listener workers' apart); the generator's and the sink's
CPU (shares of a core this box's relay did not get) and how long an accepted
session lasted on average (live sessions = rate x length: a session cap
binds the rate when sessions last longer); with listener workers
(``--smtpd-workers N``) each worker's loop lag p50/p99 and its session cap
(``qmgrd_smtpd_worker_*``); and how long each process's main thread (its
event loop) ran and how long it waited for a CPU while runnable
(``/proc/PID/schedstat``, ms per second): on a shared machine the waiting
part of the loop lag is the neighbours', not the relay's; the
control socket's round trip (a ``ping`` every 0.2 s during the
overload: p50/p99/max); and the counts: sessions sent, accepted (250),
refused with 421 4.3.2, other replies, timeouts, capped. After the
overload the bench waits for the queue to drain and prints delivered vs
accepted (nothing lost means equal). A benchmark prints; nothing is
asserted. Everything binds to 127.0.0.1.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.overloadgen import cpu_seconds, generate_into, mean_ms, nice
from bench.overloadreport import (
    cpu_line,
    lag_lines,
    log_lines,
    other_side_line,
    ping,
    timeline,
    wait_line,
)
from bench.postfix_bench import free_port, wait_port  # a sibling script, not a package
from bench.relaymetrics import (
    ControlProbe,
    relay_cpu,
    run_waits,
    scrape,
    sent,
)
from qmgrd.daemon.control import control_socket_path

REPO = Path(__file__).resolve().parents[1]
REGULATED = ("in_flow_lag_limit = 50", "in_flow_backlog_limit = 1000")  # off by default


# -- the run ----------------------------------------------------------------------------------


def start_relay(
    root: Path, port: int, sink: int, metrics: int, extra: Sequence[str]
) -> subprocess.Popen[bytes]:
    """``python -m qmgrd run`` relaying to the sink."""
    conf = root / "etc"
    conf.mkdir()
    lines = [
        f"queue_directory = {root / 'spool'}",
        f"smtpd_listen = 127.0.0.1:{port}",
        "myhostname = relay.bench",
        "mynetworks = 127.0.0.0/8",
        f"relayhost = [127.0.0.1]:{sink}",
        f"maillog_file = {root / 'maillog'}",
        f"metrics_listen = 127.0.0.1:{metrics}",
        *extra,
    ]
    (conf / "main.cf").write_text("\n".join(lines) + "\n")
    (conf / "master.cf").write_text((REPO / "config" / "master.cf").read_text())
    proc = subprocess.Popen(
        [sys.executable, "-m", "qmgrd", "-c", str(conf), "run"],
        cwd=str(REPO),
        stdout=subprocess.DEVNULL,
        stderr=(root / "stderr").open("wb"),
    )
    wait_port(port, 60, proc)
    wait_port(metrics, 60, proc)
    return proc


def main(argv: Sequence[str] | None = None) -> int:
    """Run both phases and print the figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--peak", type=float, default=15.0, help="seconds of the peak phase")
    parser.add_argument("--duration", type=float, default=60.0, help="seconds of overload")
    parser.add_argument("--factor", type=float, default=3.0, help="offered load / peak rate")
    parser.add_argument("--sessions", type=int, default=20, help="parallel sessions at peak")
    parser.add_argument("--outstanding", type=int, default=2000, help="open sessions at most")
    parser.add_argument(
        "--main-cf", action="append", default=[], help="an extra main.cf line (after REGULATED)"
    )
    parser.add_argument(
        "--smtpd-workers",
        default=None,
        help="smtpd_worker_processes (0/1: listener in process, N or auto: N workers; "
        "default: main.cf's default)",
    )
    parser.add_argument(
        "--timeline", type=float, default=10.0, help="seconds between state lines (0: none)"
    )
    args = parser.parse_args(argv)
    if args.smtpd_workers is not None:
        args.main_cf = [f"smtpd_worker_processes = {args.smtpd_workers}", *args.main_cf]
    with tempfile.TemporaryDirectory(prefix="qmgrd-overload-") as tmp:
        root = Path(tmp)
        sinkproc = subprocess.Popen(
            [sys.executable, str(REPO / "bench" / "sinkproc.py")],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            preexec_fn=nice,
        )
        assert sinkproc.stdout is not None and sinkproc.stdin is not None
        sink = int(sinkproc.stdout.readline())
        port, metrics_port = free_port(), free_port()
        extra = [*REGULATED, *args.main_cf]
        relay = start_relay(root, port, sink, metrics_port, extra)
        try:
            print(
                f"main.cf extra: {extra}; load average {os.getloadavg()[0]:.1f}",
                flush=True,
            )
            warm = args.peak / 4
            m0 = scrape(metrics_port)
            peak_counts: dict[str, int] = {}
            peak_gen: list[float] = []  # the generator's CPU seconds
            peak_thread = threading.Thread(
                target=generate_into,
                args=(peak_counts, peak_gen, port, "closed", args.sessions, args.peak, args),
            )
            peak_thread.start()
            time.sleep(warm)
            with ControlProbe(control_socket_path(root / "spool")) as peak_probe:
                t1, m1, c1 = time.monotonic(), scrape(metrics_port), relay_cpu(relay.pid)
                w1, k1 = run_waits(relay.pid), cpu_seconds(sinkproc.pid)
                peak_thread.join()
                t2, m2, c2 = time.monotonic(), scrape(metrics_port), relay_cpu(relay.pid)
                w2, k2 = run_waits(relay.pid), cpu_seconds(sinkproc.pid)
            peak = (sent(m2) - sent(m1)) / (t2 - t1)
            peak_ms = mean_ms(peak_counts)
            print(cpu_line("at peak", c1, c2, t2 - t1, sent(m2) - sent(m1)))
            print(
                f"peak: {peak:.0f} msg/s delivered ({args.sessions} sessions, "
                f"{args.peak:g} s, first {warm:g} s left out); generator {peak_counts}, "
                f"an accepted session lasts {peak_ms:.0f} ms on average"
            )
            print(other_side_line("at peak", sum(peak_gen) / args.peak, (k2 - k1) / (t2 - t1)))
            lag_lines("at peak", m1, m2)
            print(wait_line("at peak", w1, w2, t2 - t1))
            ping("at peak", peak_probe)
            rate = args.factor * peak
            print(
                f"overload: offering {rate:.0f} sessions/s ({args.factor:g}x) for "
                f"{args.duration:g} s",
                flush=True,
            )
            over_counts: dict[str, int] = {}
            over_gen: list[float] = []
            with ControlProbe(control_socket_path(root / "spool")) as probe:
                gen = threading.Thread(
                    target=generate_into,
                    args=(over_counts, over_gen, port, "open", rate, args.duration, args),
                )
                t3, m3, c3 = time.monotonic(), scrape(metrics_port), relay_cpu(relay.pid)
                w3, k3 = run_waits(relay.pid), cpu_seconds(sinkproc.pid)
                log3 = (root / "maillog").stat().st_size
                gen.start()
                timeline(metrics_port, m3, args.duration, args.timeline)
                t4, m4, c4 = time.monotonic(), scrape(metrics_port), relay_cpu(relay.pid)
                w4, k4 = run_waits(relay.pid), cpu_seconds(sinkproc.pid)
                log4 = (root / "maillog").stat().st_size
                gen.join()
            gen_share, sink_share = sum(over_gen) / args.duration, (k4 - k3) / (t4 - t3)
            under = (sent(m4) - sent(m3)) / (t4 - t3)
            print(f"load average after the overload: {os.getloadavg()[0]:.1f}")
            print(cpu_line("under overload", c3, c4, t4 - t3, sent(m4) - sent(m3)))
            print(f"rate under overload: {under:.0f} msg/s delivered = {under / peak:.0%} of peak")
            print(other_side_line("under overload", gen_share, sink_share))
            lag_lines("during overload", m3, m4)
            print(wait_line("during overload", w3, w4, t4 - t3))
            ping("under overload", probe)
            log_lines(root / "maillog", log3, log4)
            late = over_counts.get("refused late", 0)
            refused = over_counts.get("refused", 0) + late
            print(
                f"overload sessions: sent {over_counts.get('sent', 0)}, accepted "
                f"{over_counts.get('accepted', 0)}, 421 {refused} ({late} of them after the "
                f"greeting), other "
                f"{over_counts.get('other', 0)}, timeout {over_counts.get('timeout', 0)}, error "
                f"{over_counts.get('error', 0)}, capped {over_counts.get('capped', 0)}; an "
                f"accepted session lasts {mean_ms(over_counts):.0f} ms on average"
            )
            accepted = peak_counts.get("accepted", 0) + over_counts.get("accepted", 0)
            deadline = time.monotonic() + 300
            while sent(scrape(metrics_port)) - sent(m0) < accepted and time.monotonic() < deadline:
                time.sleep(0.5)
            delivered = sent(scrape(metrics_port)) - sent(m0)
            print(
                f"after draining: accepted {accepted}, delivered {delivered:.0f} "
                f"({'nothing lost' if delivered == accepted else 'MISMATCH'}), drained in "
                f"{time.monotonic() - t4:.1f} s after the overload"
            )
        finally:
            relay.send_signal(signal.SIGTERM)
            try:
                relay.wait(60)
            except subprocess.TimeoutExpired:
                relay.kill()
            sinkproc.stdin.close()
            sinkproc.wait(30)
    return 0


if __name__ == "__main__":
    sys.exit(main())
