"""Reading a running relay for benchmarks: its /metrics, loop-lag quantiles, control pings.

``scrape(port)`` returns the relay's /metrics as ``{name{labels}: value}``;
``sent`` sums its delivered recipients; ``lag_quantiles`` interpolates p50 and
p99 of a loop-lag histogram between two scrapes (the queue manager's, or a
listener worker's: ``workers`` lists the worker labels a scrape shows); ``ControlProbe`` pings the
control socket from a thread and keeps the round trips. ``relay_cpu`` and
``run_waits`` read the relay's processes from /proc: CPU seconds (queue
manager, listener workers) and how long each main thread ran and waited for a CPU.
"""

from __future__ import annotations

import re
import threading
import time
import urllib.request
from pathlib import Path

from bench.procwatch import children, sample
from qmgrd.ops.client import call

_SAMPLE = re.compile(r"^(\w+)(\{[^}]*\})? ([0-9.e+-]+|\+Inf|NaN)$")


def scrape(port: int) -> dict[str, float]:
    """The relay's /metrics as {name{labels}: value}."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        m = _SAMPLE.match(line)
        if m:
            out[m.group(1) + (m.group(2) or "")] = float(m.group(3))
    return out


def sent(metrics: dict[str, float]) -> float:
    """Recipients delivered (status sent), every transport."""
    return sum(
        v
        for k, v in metrics.items()
        if k.startswith("qmgrd_deliveries_total{") and 'status="sent"' in k
    )


def lag_quantiles(
    before: dict[str, float],
    after: dict[str, float],
    name: str = "qmgrd_event_loop_lag_seconds",
    labels: str = "",
) -> tuple[float, float, int]:
    """(p50, p99, samples) of a loop-lag histogram between two scrapes, interpolated.

    ``name``: the histogram (the queue manager's by default); ``labels``: what follows
    ``le`` in its keys (``,worker="1"`` for a listener worker's).
    """
    buckets: list[tuple[float, float]] = []
    pattern = re.compile(re.escape(name) + r'_bucket\{le="([^"]+)"' + re.escape(labels) + r"\}")
    for key, value in after.items():
        m = pattern.fullmatch(key)
        if m:
            bound = float("inf") if m.group(1) == "+Inf" else float(m.group(1))
            buckets.append((bound, value - before.get(key, 0.0)))
    buckets.sort()
    total = buckets[-1][1] if buckets else 0.0

    def q(frac: float) -> float:
        want, prev_bound, prev_count = frac * total, 0.0, 0.0
        for bound, count in buckets:
            if count >= want:
                if bound == float("inf"):
                    return prev_bound
                span = count - prev_count
                return prev_bound + (bound - prev_bound) * (
                    (want - prev_count) / span if span else 1
                )
            prev_bound, prev_count = bound, count
        return prev_bound

    return q(0.5), q(0.99), int(total)


class ControlProbe:
    """Pings the control socket every ``interval`` seconds in a thread; keeps round trips."""

    def __init__(self, sock: Path, interval: float = 0.2) -> None:
        self.sock, self.interval = sock, interval
        self.times: list[float] = []
        self.failures = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            t0 = time.monotonic()
            try:
                call(self.sock, {"op": "ping"}, timeout=10)
                self.times.append(time.monotonic() - t0)
            except Exception:  # a failed probe is what we measure, not a crash
                self.failures += 1

    def __enter__(self) -> ControlProbe:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(15)


def workers(metrics: dict[str, float]) -> list[str]:
    """The listener workers (``worker`` labels) whose loop lag a scrape shows."""
    found = re.findall(
        r'qmgrd_smtpd_worker_event_loop_lag_seconds_count\{worker="([^"]+)"\}', " ".join(metrics)
    )
    return sorted(set(found), key=int)


def relay_cpu(pid: int) -> tuple[float, float]:
    """CPU seconds so far of the queue manager (its threads included) and of its listener
    workers together (live ones, plus the reaped ones in the queue manager's cutime)."""
    got = sample(pid)
    if got is None:
        return 0.0, 0.0
    kids = [s for s in map(sample, children(pid)) if s is not None]
    return got.cpu, got.reaped + sum(k.cpu for k in kids)


def main_thread_times(pid: int) -> tuple[float, float]:
    """Seconds the process's main thread (its event loop) has run on a CPU, and spent
    runnable but not running, waiting for one (``/proc/PID/schedstat``): on a shared
    machine the second part of the loop's lag is the neighbours', not the relay's."""
    try:
        fields = Path(f"/proc/{pid}/task/{pid}/schedstat").read_text().split()
        return int(fields[0]) / 1e9, int(fields[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return 0.0, 0.0


def run_waits(pid: int) -> dict[int, tuple[float, float]]:
    """``main_thread_times`` of the queue manager (first) and each listener worker."""
    return {p: main_thread_times(p) for p in (pid, *children(pid))}
