"""The queue manager's side of intake regulation: Postfix's token rule, capacity, the lag."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from qmgrd.config import load_config
from qmgrd.daemon.intakeflow import (
    FlowCollector,
    FlowSettings,
    IntakeRegulator,
    TokenPipe,
    WorkerRegulator,
    intake_regulator,
    refill,
)
from qmgrd.daemon.looplag import LoopLag, quantile
from qmgrd.daemon.metrics import Metrics
from qmgrd.daemon.workpool import WorkPool
from tests.support.agents import stalled_agent
from tests.support.clock import FakeClock
from tests.support.config import write_config
from tests.support.engine import create_test_engine, run_until_idle, stop_engine, submit
from tests.support.waits import TIMEOUT, wait_until


@pytest.mark.parametrize(
    ("have", "behind", "moved", "change"),
    [
        (100, False, 0, 0),  # full
        (40, False, 0, 60),  # caught up: top up to the limit
        (40, True, 1, 1),  # behind: one token per message moved out of incoming/
        (40, True, 0, 0),  # behind, nothing moved: nothing
        (99, True, 5, 1),  # never above the limit
        (130, True, 1, -30),  # too many (a reload lowered the limit): take them back
    ],
)
def test_refill_is_postfixs_qmgr_rule(have: int, behind: bool, moved: int, change: int) -> None:
    """Tokens to put or take for a pipe holding ``have`` with a limit of 100."""
    assert refill(have, 100, behind=behind, moved=moved) == change


def _regulator(
    settings: FlowSettings, backlog: list[int], behind: list[bool], lag: LoopLag | None = None
) -> IntakeRegulator:
    return IntakeRegulator(
        settings, backlog=lambda: backlog[0], behind=lambda: behind[0], lag=lag or LoopLag()
    )


async def test_in_flow_delay_from_main_cf_paces_messages_to_the_queue_manager(
    tmp_path: Path,
) -> None:
    """in_flow_delay and default_process_limit: tokens run out, a moved message frees one."""
    cfg = load_config(
        write_config(tmp_path, "in_flow_delay = 7s\ndefault_process_limit = 2"),
        hostname="mx.test",
    )
    backlog, behind = [0], [True]
    reg = _regulator(FlowSettings.from_config(cfg), backlog, behind)
    try:
        assert reg.gate.delay == 7.0 and reg.pipe.count() == 2
        assert await reg.gate.admit_message() and await reg.gate.admit_message()
        third = asyncio.create_task(reg.gate.admit_message())
        await asyncio.sleep(0)
        assert not third.done() and reg.gate.paused == 1  # waiting for the queue manager
        reg.incoming_moved()  # behind: exactly one token back
        assert await asyncio.wait_for(third, 20)
        assert reg.pipe.count() == 0  # one, not more
        assert reg.gate.timeouts == 0 and reg.pipe.count() == 0
        behind[0] = False
        reg.incoming_moved()  # caught up: topped up to the limit
        await asyncio.sleep(0)  # the loop's pass ends: its moves are refilled together
        assert reg.pipe.count() == 2
    finally:
        reg.stop()


async def test_the_messages_moved_in_one_pass_are_refilled_together(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Behind: one token per message moved, put by one refill at the end of the pass."""
    cfg = load_config(write_config(tmp_path, "default_process_limit = 5"), hostname="mx.test")
    reg = _regulator(FlowSettings.from_config(cfg), [0], [True])
    writes: list[int] = []
    put = TokenPipe.put

    def counted(pipe: TokenPipe, count: int) -> int:
        writes.append(count)
        return put(pipe, count)

    monkeypatch.setattr(TokenPipe, "put", counted)
    try:
        assert reg.pipe.take(5) == 5
        for _ in range(3):
            reg.incoming_moved()
        assert reg.pipe.count() == 0  # nothing yet: the pass goes on
        await asyncio.sleep(0)
        assert reg.pipe.count() == 3 and writes == [3]
        reg.incoming_moved()
        reg.stop()  # stopped before the refill ran: nothing happens
        await asyncio.sleep(0)
        assert writes == [3]
    finally:
        reg.stop()


async def test_in_flow_delay_zero_never_pauses(tmp_path: Path) -> None:
    """in_flow_delay = 0: an empty pipe does not delay a message."""
    cfg = load_config(
        write_config(tmp_path, "in_flow_delay = 0\ndefault_process_limit = 1"),
        hostname="mx.test",
    )
    reg = _regulator(FlowSettings.from_config(cfg), [0], [True])
    try:
        for _ in range(3):
            assert await reg.gate.admit_message()
        assert reg.gate.paused == 0
    finally:
        reg.stop()


async def test_capacity_is_the_backlog_or_the_loop_lag(tmp_path: Path) -> None:
    """421 4.3.2 when the queue manager holds the backlog limit or the loop lags past its limit."""
    cfg = load_config(
        write_config(tmp_path, "in_flow_backlog_limit = 10\nin_flow_lag_limit = 40"),
        hostname="mx.test",
    )
    settings = FlowSettings.from_config(cfg)
    assert (settings.backlog_limit, settings.lag_limit) == (10, 0.04)
    backlog = [9]
    lag = LoopLag(interval=0.01)
    reg = _regulator(settings, backlog, [False], lag)
    try:
        assert not reg.overloaded() and reg.gate.admit_session()
        backlog[0] = 10
        assert reg.overloaded() and not reg.gate.admit_session()
        backlog[0] = 0
        lag.observe(0.2)  # one pause: smoothed, 0.2 * (1 - e^-0.1) = 19 ms
        assert not reg.overloaded()
        for _ in range(10):
            lag.observe(0.2)  # sustained
        assert reg.overloaded()
        reg.configure(FlowSettings(lag_limit=0.0))  # reload: no lag limit
        assert not reg.overloaded()
    finally:
        reg.stop()


async def test_loop_lag_samples_how_late_the_loop_runs() -> None:
    """A stalled loop reads as lagging at once; samples go to the histogram."""
    clock = FakeClock(0.0)
    registry = CollectorRegistry()
    lag = LoopLag(interval=0.01, registry=registry, clock=clock)
    lag.start()
    try:
        clock.advance(0.5)  # the loop did not run the sample for half a second
        assert lag.now() == pytest.approx(0.49)
        lag.observe(0.003)
        text = generate_latest(registry).decode()
        assert 'qmgrd_event_loop_lag_seconds_bucket{le="0.005"} 1.0' in text
    finally:
        lag.stop()
    assert quantile([0.001 * i for i in range(1, 101)], 0.99) == pytest.approx(0.099)
    assert quantile([], 0.5) == 0.0


async def test_metrics_export_refusals_pauses_tokens_and_workers() -> None:
    """The collector reads the gate's counters and the pool's worker states at scrape time."""
    reg = _regulator(FlowSettings(token_limit=3, backlog_limit=1), [5], [False])
    pool = WorkPool(target=1, limit=2)
    registry = CollectorRegistry()
    registry.register(FlowCollector(reg, pool))
    try:
        assert not reg.gate.admit_session()
        await pool.run(lambda: None)
        await wait_until(lambda: pool.counts().waiting == 1, "the worker to wait")
        text = generate_latest(registry).decode()
        assert "qmgrd_intake_overload_refusals_total 1.0" in text
        assert "qmgrd_intake_flow_tokens 3.0" in text
        assert 'qmgrd_workpool_workers{state="waiting"} 1.0' in text
    finally:
        reg.stop()
        pool.close()


async def test_a_stall_records_the_samples_it_hid() -> None:
    """A 50 ms stall with 10 ms ticks counts as five late samples (50, 40, 30, 20, 10 ms)."""
    clock = FakeClock(0.0)
    lag = LoopLag(interval=0.01, clock=clock)
    lag.start()
    try:
        clock.advance(0.06)  # due at 0.01, ran at 0.06: 50 ms late
        lag._tick()
        assert [round(s, 3) for s in lag.samples] == [0.05, 0.04, 0.03, 0.02, 0.01]
    finally:
        lag.stop()


async def test_the_session_cap_follows_the_loop_lag() -> None:
    """A window whose worst lag passes half the limit lowers the cap below the live sessions:
    new connections are refused; each tick looks at the samples since the last one."""
    lag = LoopLag(interval=0.01)
    reg = _regulator(FlowSettings(lag_limit=0.04, session_limit=100), [0], [False], lag)
    reg.sessions = lambda: 50
    try:
        assert reg.gate.admit_session()
        for _ in range(30):
            lag.observe(0.019)  # below the target (half the limit): the cap stays
        reg._on_tick()
        assert reg.cap.limit == 100 and reg.gate.admit_session()
        reg.gate.started()
        reg.gate.started()  # both admitted sessions began: counted in sessions() now
        for _ in range(30):
            lag.observe(0.001)
        lag.observe(0.021)  # one sample over the target in the window is enough
        reg._on_tick()
        assert reg.cap.limit == 40  # four fifths of the 50 live sessions
        assert lag.take_worst() < 0.021  # the tick took the window: a new one begins
        reg.configure(FlowSettings(lag_limit=0.5, session_limit=100))
        assert reg.session_full() and not reg.overloaded()  # small lag: only the cap
        assert not reg.gate.admit_session()
    finally:
        reg.stop()


async def test_admitted_connections_count_against_the_cap_until_their_session_begins() -> None:
    """In a listener worker (whose owner counts sessions once begun) a burst accepted in one
    wake-up cannot pass the cap before its sessions have begun: each admission counts as
    pending until the listener reports ``started()``."""
    r, w = os.pipe()
    reg = WorkerRegulator(r, FlowSettings(lag_limit=0.05, session_limit=30))
    try:
        live = [25]
        reg.sessions = lambda: live[0]
        admitted = sum(reg.gate.admit_session() for _ in range(10))
        assert admitted == 5 and reg.gate.pending == 5 and reg.session_full()
        for _ in range(5):
            reg.gate.started()
        assert reg.gate.pending == 0 and not reg.session_full()
        live[0] = 30  # they began: the owner's count has them now
        assert reg.session_full()
    finally:
        reg.stop()
        os.close(r)
        os.close(w)


async def test_in_process_the_listeners_counters_have_the_pending_connections_already() -> None:
    """In process the owner counts connections from admission (the listeners' counters):
    pending ones are not counted twice, so a burst fills the cap exactly."""
    reg = _regulator(FlowSettings(lag_limit=0.05, session_limit=5), [0], [False])
    counted = [0]
    reg.sessions = lambda: counted[0]
    try:
        for _ in range(10):
            if reg.gate.admit_session():
                counted[0] += 1  # the listener's ClientCounters.connect
        assert counted[0] == 5 and reg.gate.pending == 5
    finally:
        reg.stop()


async def test_a_regulator_started_again_gets_a_fresh_full_pipe() -> None:
    """stop() closes the pipe; start() after it opens a new one with every token in it."""
    reg = _regulator(FlowSettings(token_limit=4), [0], [False])
    reg.start()
    assert await reg.gate.admit_message()
    reg.stop()
    reg.start()
    try:
        assert reg.pipe.count() == 4 and await reg.gate.admit_message()
    finally:
        reg.stop()


async def test_the_queue_managers_loop_lag_is_idle_only_with_nothing_in_flight(
    tmp_path: Path,
) -> None:
    """The queue manager's lag sampler slows down (``LoopLag.idle``) only while no session is
    live and the engine holds nothing: a delivery in flight or a session keeps it every 10 ms."""
    agent = stalled_agent()
    engine, spool, clock = create_test_engine(tmp_path, agent)
    cfg = load_config(write_config(tmp_path, ""), hostname="mx.test")
    pool = WorkPool()
    reg = intake_regulator(cfg, engine, Metrics(), pool)
    idle = reg.lag.idle
    assert idle is not None and idle()  # nothing yet
    task = await run_until_idle(engine)
    try:
        assert idle()
        reg.sessions = lambda: 1  # a live session (in-process listeners)
        assert not idle()
        reg.sessions = lambda: 0
        submit(spool, clock, "a@example.org", ["b@example.net"])
        engine.request_incoming_scan()
        await agent.wait_started(1)
        assert not idle()  # a delivery in flight
        agent.release()
        await asyncio.wait_for(engine.wait_idle(), TIMEOUT)
        assert idle()
    finally:
        await stop_engine(engine, task)
        reg.stop()
        pool.close()
