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
box. A load generator in its own process sends 1 KB
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
manager's and the listener workers' apart); with listener workers
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
import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.postfix_bench import free_port, wait_port  # a sibling script, not a package
from bench.relaymetrics import (
    ControlProbe,
    lag_quantiles,
    relay_cpu,
    run_waits,
    scrape,
    sent,
    workers,
)
from qmgrd.daemon.control import control_socket_path
from qmgrd.daemon.looplag import quantile

REPO = Path(__file__).resolve().parents[1]
_BODY = b"Subject: overload\r\n\r\n" + (b"x" * 70 + b"\r\n") * 14 + b".\r\n"  # about 1 KB
_SESSION_TIMEOUT = 30.0
REGULATED = ("in_flow_lag_limit = 50", "in_flow_backlog_limit = 1000")  # off by default
NICE = 10  # niceness of the generator and sink processes


# -- the load generator (its own process: --generate) --------------------------------------


async def _reply(reader: asyncio.StreamReader) -> bytes:
    while True:
        line = await reader.readline()
        if not line or line[3:4] != b"-":
            return line


async def _message(port: int, n: int) -> str:
    """One session, one message: accepted, refused (421), other, or error."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        if (await _reply(reader)).startswith(b"421"):
            return "refused"
        steps = (
            b"EHLO gen.bench",
            f"MAIL FROM:<g{n}@gen.bench>".encode(),
            b"RCPT TO:<r@sink.bench>",
        )
        for line in steps:
            writer.write(line + b"\r\n")
            reply = await _reply(reader)
            if reply.startswith(b"421"):
                return "refused late"  # after the session's start: its work so far wasted
            if not reply.startswith(b"250"):
                return "other"
        writer.write(b"DATA\r\n")
        if not (await _reply(reader)).startswith(b"354"):
            return "other"
        writer.write(_BODY)
        reply = await _reply(reader)
        writer.write(b"QUIT\r\n")
        return "accepted" if reply.startswith(b"250") else "other"
    finally:
        writer.close()


async def _guarded(port: int, n: int, counts: dict[str, int]) -> None:
    try:
        outcome = await asyncio.wait_for(_message(port, n), _SESSION_TIMEOUT)
    except TimeoutError:
        outcome = "timeout"
    except OSError:
        outcome = "error"
    counts[outcome] = counts.get(outcome, 0) + 1


async def generate(port: int, mode: str, value: float, duration: float, cap: int) -> dict[str, int]:
    """closed: ``value`` sessions in parallel; open: ``value`` new sessions per second."""
    counts: dict[str, int] = {"sent": 0}
    end = time.monotonic() + duration
    if mode == "closed":

        async def worker(w: int) -> None:
            n = w
            while time.monotonic() < end:
                counts["sent"] += 1
                await _guarded(port, n, counts)
                n += int(value)

        await asyncio.gather(*(worker(w) for w in range(int(value))))
        return counts
    tasks: set[asyncio.Task[None]] = set()
    start, n = time.monotonic(), 0
    while time.monotonic() < end:
        due = start + n / value
        delay = due - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        n += 1
        if len(tasks) >= cap:
            counts["capped"] = counts.get("capped", 0) + 1
            continue
        counts["sent"] += 1
        task = asyncio.create_task(_guarded(port, n, counts))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
    if tasks:
        await asyncio.wait(tasks, timeout=_SESSION_TIMEOUT + 5)
    return counts


def _nice() -> None:
    """The generator and the sink stand for other machines: they yield the CPU to the relay."""
    os.nice(NICE)


def run_generator(port: int, mode: str, value: float, duration: float, cap: int) -> dict[str, int]:
    """Run the generator in a child process (so it does not share the bench's loop)."""
    out = subprocess.run(
        [
            sys.executable,
            __file__,
            "--generate",
            mode,
            str(value),
            str(duration),
            str(port),
            str(cap),
        ],
        check=True,
        capture_output=True,
        cwd=str(REPO),
        preexec_fn=_nice,
    )
    counts: dict[str, int] = json.loads(out.stdout.decode().strip().splitlines()[-1])
    return counts


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


def _ping(when: str, probe: ControlProbe) -> None:
    times = probe.times
    print(
        f"control socket ping {when}: p50 {quantile(times, 0.5) * 1000:.1f} ms, p99 "
        f"{quantile(times, 0.99) * 1000:.1f} ms, max {max(times, default=0) * 1000:.1f}"
        f" ms ({len(times)} probes, {probe.failures} failed)"
    )


def _wait_line(
    when: str,
    before: dict[int, tuple[float, float]],
    after: dict[int, tuple[float, float]],
    seconds: float,
) -> str:
    parts = []
    for n, pid in enumerate(after):
        if pid in before:
            ran, waited = (a - b for a, b in zip(after[pid], before[pid], strict=True))
            who = "queue manager" if n == 0 else f"worker pid {pid}"
            parts.append(
                f"{who} ran {ran * 1000 / seconds:.0f} ms/s, waited {waited * 1000 / seconds:.0f}"
            )
    return f"main threads {when} (schedstat, ms per second): " + ", ".join(parts)


def _cpu_line(
    when: str,
    before: tuple[float, float],
    after: tuple[float, float],
    seconds: float,
    delivered: float,
) -> str:
    qmgr, smtpd = after[0] - before[0], after[1] - before[1]
    line = (
        f"relay CPU {when}: {(qmgr + smtpd) / seconds:.0%} of a core, "
        f"{(qmgr + smtpd) * 1000 / max(1.0, delivered):.2f} ms per delivered message"
    )
    if smtpd:
        line += f" (queue manager {qmgr / seconds:.0%}, listener workers {smtpd / seconds:.0%})"
    return line


def _lag_lines(when: str, before: dict[str, float], after: dict[str, float]) -> None:
    p50, p99, n = lag_quantiles(before, after)
    print(f"event-loop lag {when}: p50 {p50 * 1000:.1f} ms, p99 {p99 * 1000:.1f} ms ({n} samples)")
    for worker in workers(after):
        w50, w99, wn = lag_quantiles(
            before, after, "qmgrd_smtpd_worker_event_loop_lag_seconds", f',worker="{worker}"'
        )
        cap = after.get(f'qmgrd_smtpd_worker_session_cap{{worker="{worker}"}}', 0)
        print(
            f"  listener worker {worker} loop lag {when}: p50 {w50 * 1000:.1f} ms, p99 "
            f"{w99 * 1000:.1f} ms ({wn} samples); session cap at the end {cap:.0f}"
        )


_LOG_LINE = re.compile(rb"^.*? (\S+?)\[\d+\]: (?:[0-9A-Za-z]{10,}: )?(.*)$")
_LOG_KIND = re.compile(rb"^(warning: |error: )?([A-Za-z][A-Za-z :]*?)(?=[=,(\[<]|:? \S*[0-9\[=]|$)")


def _log_lines(maillog: Path, start: int, end: int) -> None:
    """Log lines written between two offsets of the maillog: per process and per kind."""
    with maillog.open("rb") as f:
        f.seek(start)
        text = f.read(max(0, end - start))
    kinds: dict[tuple[bytes, bytes], int] = {}
    lines = text.splitlines()
    for line in lines:
        m = _LOG_LINE.match(line[:300])
        program, message = (m.group(1), m.group(2)) if m else (b"?", line[:40])
        k = _LOG_KIND.match(message)
        kind = (k.group(1) or b"") + k.group(2) if k else message[:30]
        kinds[(program, kind)] = kinds.get((program, kind), 0) + 1
    top = sorted(kinds.items(), key=lambda kv: -kv[1])[:8]
    print(
        f"maillog during overload: {len(lines)} lines, {len(text) / 1024:.0f} KiB; most: "
        + "; ".join(f"{p.decode()} {k.decode().strip()!r} {n}" for (p, k), n in top)
    )


def _timeline(port: int, start: dict[str, float], duration: float, step: float) -> None:
    """Sleep ``duration``; with ``step`` > 0 print the relay's state every ``step`` seconds."""
    if step <= 0:
        time.sleep(duration)
        return
    end, prev, t_prev = time.monotonic() + duration, start, time.monotonic()
    while (left := end - time.monotonic()) > 0:
        time.sleep(min(step, left))
        now, t_now = scrape(port), time.monotonic()
        span = t_now - t_prev
        msgs = "qmgrd_smtpd_messages_total"
        line = (
            f"  t+{duration - max(0.0, end - t_now):4.0f}s: delivered "
            f"{(sent(now) - sent(prev)) / span:4.0f}/s, accepted "
            f"{(now.get(msgs, 0) - prev.get(msgs, 0)) / span:4.0f}/s, in core "
            f"{now.get('qmgrd_messages_in_core', 0):.0f} + waiting "
            f"{now.get('qmgrd_messages_waiting', 0):.0f}, qm lag p99 "
            f"{lag_quantiles(prev, now)[1] * 1000:.0f} ms"
        )
        for worker in workers(now):
            w99 = lag_quantiles(
                prev, now, "qmgrd_smtpd_worker_event_loop_lag_seconds", f',worker="{worker}"'
            )[1]
            label = '{worker="' + worker + '"}'
            line += (
                f"; w{worker} sessions {now.get('qmgrd_smtpd_worker_sessions' + label, 0):.0f}"
                f" cap {now.get('qmgrd_smtpd_worker_session_cap' + label, 0):.0f}"
                f" lag p99 {w99 * 1000:.0f} ms"
            )
        print(line, flush=True)
        prev, t_prev = now, t_now


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
            preexec_fn=_nice,
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
            peak_thread = threading.Thread(
                target=lambda: peak_counts.update(
                    run_generator(port, "closed", args.sessions, args.peak, args.outstanding)
                )
            )
            peak_counts: dict[str, int] = {}
            peak_thread.start()
            time.sleep(warm)
            with ControlProbe(control_socket_path(root / "spool")) as peak_probe:
                t1, m1, c1 = time.monotonic(), scrape(metrics_port), relay_cpu(relay.pid)
                w1 = run_waits(relay.pid)
                peak_thread.join()
                t2, m2, c2 = time.monotonic(), scrape(metrics_port), relay_cpu(relay.pid)
                w2 = run_waits(relay.pid)
            peak = (sent(m2) - sent(m1)) / (t2 - t1)
            print(_cpu_line("at peak", c1, c2, t2 - t1, sent(m2) - sent(m1)))
            print(
                f"peak: {peak:.0f} msg/s delivered ({args.sessions} sessions, "
                f"{args.peak:g} s, first {warm:g} s left out); generator {peak_counts}"
            )
            _lag_lines("at peak", m1, m2)
            print(_wait_line("at peak", w1, w2, t2 - t1))
            _ping("at peak", peak_probe)
            rate = args.factor * peak
            print(
                f"overload: offering {rate:.0f} sessions/s ({args.factor:g}x) for "
                f"{args.duration:g} s",
                flush=True,
            )
            over_counts: dict[str, int] = {}
            with ControlProbe(control_socket_path(root / "spool")) as probe:
                gen = threading.Thread(
                    target=lambda: over_counts.update(
                        run_generator(port, "open", rate, args.duration, args.outstanding)
                    )
                )
                t3, m3, c3 = time.monotonic(), scrape(metrics_port), relay_cpu(relay.pid)
                w3 = run_waits(relay.pid)
                log3 = (root / "maillog").stat().st_size
                gen.start()
                _timeline(metrics_port, m3, args.duration, args.timeline)
                t4, m4, c4 = time.monotonic(), scrape(metrics_port), relay_cpu(relay.pid)
                w4 = run_waits(relay.pid)
                log4 = (root / "maillog").stat().st_size
                gen.join()
            under = (sent(m4) - sent(m3)) / (t4 - t3)
            print(f"load average after the overload: {os.getloadavg()[0]:.1f}")
            print(_cpu_line("under overload", c3, c4, t4 - t3, sent(m4) - sent(m3)))
            print(f"rate under overload: {under:.0f} msg/s delivered = {under / peak:.0%} of peak")
            _lag_lines("during overload", m3, m4)
            print(_wait_line("during overload", w3, w4, t4 - t3))
            _ping("under overload", probe)
            _log_lines(root / "maillog", log3, log4)
            late = over_counts.get("refused late", 0)
            refused = over_counts.get("refused", 0) + late
            print(
                f"overload sessions: sent {over_counts.get('sent', 0)}, accepted "
                f"{over_counts.get('accepted', 0)}, 421 {refused} ({late} of them after the "
                f"greeting), other "
                f"{over_counts.get('other', 0)}, timeout {over_counts.get('timeout', 0)}, error "
                f"{over_counts.get('error', 0)}, capped {over_counts.get('capped', 0)}"
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
    if len(sys.argv) > 1 and sys.argv[1] == "--generate":
        mode, value, duration, port, cap = sys.argv[2:7]
        try:
            import uvloop

            result = uvloop.run(generate(int(port), mode, float(value), float(duration), int(cap)))
        except ImportError:
            result = asyncio.run(generate(int(port), mode, float(value), float(duration), int(cap)))
        print(json.dumps(result), flush=True)
        sys.exit(0)
    sys.exit(main())
