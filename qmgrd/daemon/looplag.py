"""Event-loop lag: how late the loop runs a callback that was due, sampled continuously.

Contract
--------
``LoopLag(interval).start()`` schedules a callback (a ``call_later`` chain
on the running loop); each time it runs, the difference between when it ran
and when it was due is one sample. The lag is what every other callback on
the loop waits too: an SMTP reply, a delivery's next step, the control
socket's answer. The step between samples is ``interval``; while the owner
says the loop is idle (``idle()``, e.g. a listener worker with no session:
``qmgrd.daemon.smtpd``) and the samples show it keeps up (under ``QUIET``),
each step doubles, up to ``slow`` (default ``SLOW``, 100 ms): a timer every
10 ms woke an idle process 100 times a second (measured: 9-10 ms of CPU a
second per idle listener worker, 1.3-3.3 at 100 ms). A loop with work (or
without ``idle``) is sampled every ``interval``, as the regulator's windows
need (``qmgrd.core.sessioncap``: a window's worst lag). A sample
taken after a step of ``k`` intervals stands for the ``k`` samples the fixed
step would have taken (the histogram, buckets and quantiles count it ``k``
times), so the figures keep weighing time, not ticks; the moving average
decays over the ``k - 1`` skipped samples as over quiet ones, then takes the
sample once, as the fixed step would (one stall caught after a long step
does not weigh ``k`` times in the regulator's signal). A loop that starts to
lag is overdue at once (``now``), and its next sample brings the step back
to ``interval``.

- ``now()``: the lag the loop has at this moment: the samples' moving
  average (time constant ``SMOOTHING``, so one garbage-collection pause does
  not count as overload), or, if the next sample is overdue, how overdue it
  is (a loop stuck in one long callback reads as lagging at once);
- ``take_worst()``: the worst lag since the previous call (every sample, and
  how overdue the next one is now), for a controller that looks at windows
  (``qmgrd.core.sessioncap``); each call starts a new window;
- ``samples``: the most recent samples (bounded) for quantiles; a stall
  that delayed one sample by L also records the L/interval samples it hid
  (each as late as it would have been), so quantiles weigh time, not ticks
  (no coordinated omission);
- ``histogram``: ``qmgrd_event_loop_lag_seconds`` in the registry given
  (the daemon's metrics), every sample observed (as many times as it weighs);
- ``buckets`` and ``total``: the same histogram kept as plain numbers (samples
  per ``LAG_BUCKETS`` bucket, the last one +Inf, not cumulative; their sum),
  what a listener worker sends its queue manager (``qmgrd.daemon.ipc``).

``stop()`` ends the chain. The clock is injected (``time.monotonic``).
"""

from __future__ import annotations

import asyncio
import bisect
import itertools
import math
import time
from collections import deque
from collections.abc import Callable

from prometheus_client import CollectorRegistry, Histogram

__all__ = ["LAG_BUCKETS", "QUIET", "SLOW", "SMOOTHING", "LoopLag", "quantile"]

LAG_BUCKETS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.2, 0.5, 1.0, 2.5)
_KEEP = 12000  # samples kept for quantiles (two minutes at the default interval)
SMOOTHING = 0.1  # seconds: time constant of the moving average now() reports
_MAX_BACKFILL = 1000  # samples recorded for the ticks one stall hid, at most
QUIET = 0.005  # seconds: a sample under this, the loop keeps up (the next step doubles)
SLOW = 0.1  # seconds: the longest step between samples while the loop keeps up


def quantile(samples: list[float], q: float) -> float:
    """The ``q`` quantile (0..1) of ``samples`` by the nearest-rank method; 0.0 when empty."""
    if not samples:
        return 0.0
    ordered = sorted(samples)
    index = min(len(ordered) - 1, max(0, int(q * len(ordered) + 0.999999) - 1))
    return ordered[index]


class LoopLag:
    """Samples the running loop's lag (see the module doc)."""

    __slots__ = (
        "_alpha",
        "_clock",
        "_due",
        "_handle",
        "_loop",
        "_worst",
        "average",
        "buckets",
        "histogram",
        "idle",
        "interval",
        "last",
        "samples",
        "slow",
        "step",
        "total",
    )

    def __init__(
        self,
        interval: float = 0.01,
        *,
        slow: float = SLOW,
        idle: Callable[[], bool] | None = None,
        registry: CollectorRegistry | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """Sample every ``interval`` seconds, up to every ``slow`` while ``idle()`` and the loop
        keeps up (module doc); export the histogram in ``registry`` if given."""
        self.interval = interval
        self.idle = idle  # the owner's "no work here now" (None: never slower)
        self.slow = max(slow, interval)
        self.step = interval  # seconds to the next sample
        self._clock = clock
        self._loop: asyncio.AbstractEventLoop | None = None
        self._handle: asyncio.TimerHandle | None = None
        self._due = 0.0
        self.last = 0.0
        self.average = 0.0  # exponential moving average of the samples
        self._worst = 0.0  # the worst sample since the last take_worst
        self._alpha = 1.0 - math.exp(-interval / SMOOTHING)
        self.samples: deque[float] = deque(maxlen=_KEEP)
        self.buckets = [0] * (len(LAG_BUCKETS) + 1)  # per bucket (le), the last one +Inf
        self.total = 0.0  # sum of the samples
        self.histogram = (
            Histogram(
                "qmgrd_event_loop_lag_seconds",
                "How late the event loop ran a callback that was due (sampled every "
                f"{interval * 1000:g} ms, up to every {self.slow * 1000:g} ms while idle, each "
                "sample counted for the time it stands for): the wait every reply and delivery "
                "step sees.",
                buckets=LAG_BUCKETS,
                registry=registry,
            )
            if registry is not None
            else None
        )

    def start(self) -> None:
        """Begin sampling on the running loop."""
        self._loop = asyncio.get_running_loop()
        self.step = self.interval
        self._schedule()

    def _schedule(self) -> None:
        assert self._loop is not None
        self._due = self._clock() + self.step
        self._handle = self._loop.call_later(self.step, self._tick)

    def _tick(self) -> None:
        lag = max(0.0, self._clock() - self._due)
        # This sample stands for the samples a fixed step would have taken since the last.
        self.observe(lag, max(1, round(self.step / self.interval)))
        # A stall of L seconds delays one sample by L but hides the L/interval samples
        # that would have been taken meanwhile (coordinated omission): record them
        # too, each as late as it would have been, so quantiles weigh time, not ticks.
        missed = lag - self.interval
        for _ in range(_MAX_BACKFILL):
            if missed <= 0:
                break
            self.observe(missed)
            missed -= self.interval
        # Idle and keeping up: the next sample comes later (module doc); else every interval.
        idle = self.idle is not None and lag < QUIET and self.idle()
        self.step = min(self.step * 2, self.slow) if idle else self.interval
        self._schedule()

    def observe(self, lag: float, weight: int = 1) -> None:
        """Record one sample standing for ``weight`` samples (the timer's; tests feed their own)."""
        self.last = lag
        if lag > self._worst:
            self._worst = lag
        if weight == 1:
            self.samples.append(lag)
        else:
            # The moving average (the regulator's signal) takes the skipped samples as
            # quiet, as the ones before them were: one late sample moves it as much as
            # after a fixed step, not ``weight`` times as much.
            self.average *= math.exp(-(weight - 1) * self.interval / SMOOTHING)
            self.samples.extend(itertools.repeat(lag, weight))
        self.average += (lag - self.average) * self._alpha
        self.buckets[bisect.bisect_left(LAG_BUCKETS, lag)] += weight
        self.total += lag * weight
        if self.histogram is not None:
            for _ in range(weight):
                self.histogram.observe(lag)

    def clock(self) -> float:
        """The clock the samples are taken with."""
        return self._clock()

    def now(self) -> float:
        """The lag at this moment (the moving average, or how overdue the next sample is)."""
        if self._handle is None:
            return self.average
        return max(self.average, self._clock() - self._due)

    def take_worst(self) -> float:
        """The worst lag since the last call (samples, or the next one overdue); a new window."""
        worst = self._worst
        if self._handle is not None:
            worst = max(worst, self._clock() - self._due)
        self._worst = 0.0
        return worst

    def stop(self) -> None:
        """End sampling."""
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
