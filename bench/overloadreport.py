"""Printing bench/overload.py's figures: per-phase lines, the overload's timeline, log volume.

Each function prints (or returns) one kind of line from what ``bench.relaymetrics`` reads:
``ping`` (control-socket round trips), ``wait_line`` (schedstat run and wait times),
``cpu_line`` (CPU share and per message), ``other_side_line`` (the generator's and
the sink's CPU), ``lag_lines`` (loop-lag quantiles, per worker too),
``log_lines`` (maillog lines between two offsets, per process and kind) and ``timeline``
(sleeps through the overload, printing the relay's state every few seconds).
"""

from __future__ import annotations

import re
import time
from pathlib import Path

from bench.relaymetrics import ControlProbe, lag_quantiles, scrape, sent, workers
from qmgrd.daemon.looplag import quantile


def ping(when: str, probe: ControlProbe) -> None:
    times = probe.times
    print(
        f"control socket ping {when}: p50 {quantile(times, 0.5) * 1000:.1f} ms, p99 "
        f"{quantile(times, 0.99) * 1000:.1f} ms, max {max(times, default=0) * 1000:.1f}"
        f" ms ({len(times)} probes, {probe.failures} failed)"
    )


def wait_line(
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


def cpu_line(
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


def other_side_line(when: str, generator: float, sink: float) -> str:
    """The load generator's and the sink's CPU (shares of a core): they stand for other
    machines, but on this box what they take is not the relay's."""
    return (
        f"generator and sink CPU {when}: generator {generator:.0%} of a core, "
        f"sink {sink:.0%} (both niced)"
    )


def lag_lines(when: str, before: dict[str, float], after: dict[str, float]) -> None:
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


def log_lines(maillog: Path, start: int, end: int) -> None:
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


def timeline(port: int, start: dict[str, float], duration: float, step: float) -> None:
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
