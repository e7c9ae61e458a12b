"""LoopLag's step: slow while the loop is idle and keeps up, else every interval."""

from __future__ import annotations

import argparse
import asyncio
import os
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from qmgrd.config import load_config
from qmgrd.daemon.looplag import LAG_BUCKETS, QUIET, SLOW, LoopLag, quantile
from qmgrd.daemon.smtpd import Worker
from tests.support.clock import FakeClock
from tests.support.config import write_config


def _run_tick(lag: LoopLag, clock: FakeClock, late: float) -> None:
    """Let the next sample come due and run ``late`` seconds after that."""
    clock.advance(lag.step + late)
    lag._tick()


async def test_a_quiet_loop_is_sampled_less_often_and_a_lag_brings_the_interval_back() -> None:
    """On-time samples double the step up to ``slow``; one late sample resets it at once."""
    clock = FakeClock(0.0)
    lag = LoopLag(interval=0.01, idle=lambda: True, clock=clock)
    loop = asyncio.get_running_loop()
    lag.start()
    try:
        steps = []
        for _ in range(6):
            _run_tick(lag, clock, 0.0)
            steps.append(round(lag.step, 3))
            assert lag._handle is not None  # the timer really waits the step
            assert lag._handle.when() - loop.time() == pytest.approx(lag.step, abs=0.005)
        assert steps == [0.02, 0.04, 0.08, 0.1, 0.1, 0.1] and SLOW == 0.1
        _run_tick(lag, clock, QUIET / 2)  # late, but under QUIET: still keeping up
        assert lag.step == 0.1
        _run_tick(lag, clock, QUIET)  # lagging: sampled every interval again
        assert lag.step == 0.01
        _run_tick(lag, clock, 0.0)
        assert lag.step == 0.02
        clock.advance(lag.step + 0.5)  # stuck: overdue at once, before the sample runs
        assert lag.now() == pytest.approx(0.5)
    finally:
        lag.stop()


async def test_a_loop_with_work_or_no_idle_signal_is_sampled_every_interval() -> None:
    """Work on the loop (``idle()`` false) or no ``idle`` at all: every interval, as before."""
    clock = FakeClock(0.0)
    busy = [False]
    lags = [LoopLag(interval=0.01, idle=lambda: not busy[0], clock=clock), LoopLag(clock=clock)]
    for lag in lags:
        lag.start()
    try:
        _run_tick(lags[0], clock, 0.0)
        _run_tick(lags[0], clock, 0.0)
        assert lags[0].step == 0.04
        busy[0] = True  # a session began
        _run_tick(lags[0], clock, 0.0)
        assert lags[0].step == 0.01
        for _ in range(5):
            _run_tick(lags[1], clock, 0.0)
            assert lags[1].step == 0.01
    finally:
        for lag in lags:
            lag.stop()


async def test_a_sample_after_a_long_step_counts_for_the_samples_it_stands_for() -> None:
    """A 3 ms sample after a 100 ms step is ten 3 ms samples: buckets, total, histogram."""
    clock = FakeClock(0.0)
    registry = CollectorRegistry()
    lag = LoopLag(interval=0.01, idle=lambda: True, registry=registry, clock=clock)
    lag.start()
    try:
        while lag.step < SLOW:
            _run_tick(lag, clock, 0.0)
        before = list(lag.buckets)
        kept = len(lag.samples)
        _run_tick(lag, clock, 0.003)
        added = [b - a for a, b in zip(before, lag.buckets, strict=True)]
        assert added[LAG_BUCKETS.index(0.005)] == 10 and sum(added) == 10
        assert lag.total == pytest.approx(0.03)
        assert list(lag.samples)[kept:] == pytest.approx([0.003] * 10)
        text = generate_latest(registry).decode()
        assert "qmgrd_event_loop_lag_seconds_count 25.0" in text  # 1+2+4+8 on time, then 10
    finally:
        lag.stop()


async def test_quantiles_weigh_time_not_ticks() -> None:
    """One second of a loop keeping up (14 ticks) then 30 ms of lag on every tick for 0.13 s:
    the median is the quiet loop's, the p95 the lagging one's, as with a fixed 10 ms step."""
    clock = FakeClock(0.0)
    lag = LoopLag(interval=0.01, idle=lambda: True, clock=clock)
    lag.start()
    try:
        ticks = 0
        while clock() < 1.0:
            _run_tick(lag, clock, 0.0)
            ticks += 1
        assert ticks <= 15  # a fixed 10 ms step: 100 wake-ups
        for _ in range(5):
            _run_tick(lag, clock, 0.03)
        samples = list(lag.samples)
        assert quantile(samples, 0.5) == 0.0
        assert quantile(samples, 0.95) >= 0.02
        assert lag.now() > 0.01  # the moving average follows the lag
    finally:
        lag.stop()


async def test_a_stall_caught_after_a_long_step_moves_the_average_as_after_a_fixed_step() -> None:
    """The moving average takes the skipped samples as quiet: a 30 ms sample after a 100 ms
    step leaves it where nine quiet 10 ms samples and then the late one would."""
    clock = FakeClock(0.0)
    slow = LoopLag(interval=0.01, idle=lambda: True, clock=clock)
    fixed = LoopLag(interval=0.01, clock=clock)
    slow.start()
    try:
        while slow.step < SLOW:
            _run_tick(slow, clock, 0.0)
        slow.average = fixed.average = 0.004  # where an earlier lag left both
        slow.observe(0.03, 10)
        for _ in range(9):
            fixed.observe(0.0)
        fixed.observe(0.03)
        assert slow.average == pytest.approx(fixed.average)
        assert slow.average < 0.004 + 0.03 * 0.1  # one sample's share, not ten
    finally:
        slow.stop()


async def test_a_listener_worker_samples_slower_only_without_sessions(tmp_path: Path) -> None:
    """The worker's loop lag is idle while no session is live nor admitted."""
    cfg = load_config(write_config(tmp_path, ""), hostname="mx.test")
    read_fd, write_fd = os.pipe()
    args = argparse.Namespace(spool=tmp_path / "spool", slot=1, slots=3, tokens=read_fd)
    try:
        worker = Worker(args, cfg)
        assert worker.regulator is not None
        idle = worker.regulator.lag.idle
        assert idle is not None and idle()
        worker.intake.sessions = 1
        assert not idle()
    finally:
        os.close(write_fd)
        os.close(read_fd)
