"""The queue manager's side of intake regulation: flow tokens, capacity, their metrics.

Theory of operation
-------------------
Postfix's qmgr feeds a token pipe that every mail-receiving process reads
one token from per message (``in_flow_delay``; see ``qmgrd.listener.inflow``
for the listener's side). We do the same with a real pipe, so listener
worker processes can share it:

- each message the queue manager moves out of ``incoming/`` (the loader's
  ``incoming_moved`` hook) may put one token back (the messages moved in one pass
  of the event loop together, with one refill);
- the rule is Postfix's ``qmgr_loop`` (:func:`refill`): with fewer than
  ``limit`` tokens in the pipe (``default_process_limit``, Postfix's
  ``var_proc_limit``), put one per message moved while the queue manager is
  behind (messages wait to be loaded), or top the pipe up to ``limit`` when
  it has caught up; with more than ``limit``, take the excess back. The
  pipe's content is counted with ``FIONREAD`` (Postfix's
  ``mail_flow_count``). A tick every ``REFILL_INTERVAL`` seconds applies the
  rule too, so tokens taken by transactions that were never committed come
  back once the queue manager is idle.

So when mail arrives faster than the queue manager takes it in, the
listeners run out of tokens and each new message waits up to
``in_flow_delay`` -- inflow is paced to the queue manager's outflow plus
``limit`` messages per ``in_flow_delay`` at most, as in Postfix.

New sessions are also held to a cap learned from the loop's lag
(``qmgrd.core.sessioncap``, updated every tick with the worst lag of the
tick's window): past half of ``in_flow_lag_limit`` it drops to four fifths
of the live sessions, and grows back while the loop keeps up. Sessions over
the cap get 421 4.3.2 at connect.

Capacity (:meth:`IntakeRegulator.overloaded`, the 421 4.3.2 refusals) is
measured, not guessed; the relay is over capacity when either

- the queue manager holds ``in_flow_backlog_limit`` messages or more
  (active queue plus messages waiting to be loaded: delivery is behind
  intake and accepting more only lengthens the queue), or
- the event loop's lag (``qmgrd.daemon.looplag``) is above
  ``in_flow_lag_limit`` milliseconds (the loop is saturated: every more
  session slows every reply, every delivery and the control socket).

The lag is sampled every 10 ms while anything is in flight; with no session
live and the engine idle (nothing in core, the table or its tasks) the step
grows to 100 ms (``LoopLag.idle``), as in an idle listener worker.

Listener worker processes (``smtpd_worker_processes`` > 1) run a
:class:`WorkerRegulator` each: they inherit the pipe's read end (every
worker takes tokens from the same pipe, as every Postfix smtpd does), the
queue manager sends them the backlog half over the notify channel
(``["backlog", bool]``, ``qmgrd.daemon.workers``), and each adds its own
loop's lag and keeps its own session cap. Their gates' counters come back
with their intake counts (``worker_counts``) and are added to the metrics.
"""

from __future__ import annotations

import array
import asyncio
import fcntl
import os
import termios
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from qmgrd.config import Config
from qmgrd.core.sessioncap import SessionCap
from qmgrd.daemon.engine import Engine
from qmgrd.daemon.looplag import LoopLag
from qmgrd.daemon.metrics import Metrics
from qmgrd.daemon.workpool import WorkPool
from qmgrd.listener.inflow import TokenGate

__all__ = [
    "REFILL_INTERVAL",
    "FlowSettings",
    "IntakeRegulator",
    "ProcessRegulator",
    "TokenPipe",
    "WorkerRegulator",
    "refill",
]

REFILL_INTERVAL = 0.1  # seconds between ticks: refill, session cap


def refill(have: int, limit: int, *, behind: bool, moved: int) -> int:
    """Tokens to put into the pipe (> 0) or take out (< 0): Postfix's qmgr_loop rule."""
    if have > limit:
        return limit - have
    if behind:
        return min(moved, limit - have)
    return limit - have


class TokenPipe:
    """A non-blocking pipe; one byte is one token."""

    __slots__ = ("closed", "read_fd", "write_fd")

    def __init__(self) -> None:
        self.closed = False
        self.read_fd, self.write_fd = os.pipe()
        os.set_blocking(self.read_fd, False)
        os.set_blocking(self.write_fd, False)

    def count(self) -> int:
        """Tokens in the pipe now (FIONREAD)."""
        buf = array.array("i", [0])
        fcntl.ioctl(self.read_fd, termios.FIONREAD, buf)
        return buf[0]

    def put(self, count: int) -> int:
        """Write up to ``count`` tokens; how many fit."""
        try:
            return os.write(self.write_fd, b"t" * count) if count > 0 else 0
        except BlockingIOError:
            return 0

    def take(self, count: int) -> int:
        """Read up to ``count`` tokens; how many there were."""
        try:
            return len(os.read(self.read_fd, count)) if count > 0 else 0
        except BlockingIOError:
            return 0

    def close(self) -> None:
        """Close both ends (once)."""
        if not self.closed:
            self.closed = True
            for fd in (self.read_fd, self.write_fd):
                os.close(fd)


@dataclass(frozen=True, slots=True)
class FlowSettings:
    """The intake regulation parameters (main.cf)."""

    in_flow_delay: float = 1.0  # seconds; 0 = no pacing
    backlog_limit: int = 0  # in_flow_backlog_limit; 0 = none
    lag_limit: float = 0.0  # in_flow_lag_limit, in seconds; 0 = none
    token_limit: int = 100  # default_process_limit
    session_limit: int = 1000  # smtpd_session_limit: the session cap's ceiling

    @classmethod
    def from_config(cls, cfg: Config) -> FlowSettings:
        """The settings from main.cf."""
        return cls(
            in_flow_delay=float(cfg.get_time("in_flow_delay")),
            backlog_limit=cfg.get_int("in_flow_backlog_limit"),
            lag_limit=cfg.get_int("in_flow_lag_limit") / 1000.0,
            token_limit=cfg.get_int("default_process_limit"),
            session_limit=cfg.get_int("smtpd_session_limit"),
        )


class ProcessRegulator:
    """One process's intake gate: its tokens, capacity and session cap (module doc).

    The queue manager's :class:`IntakeRegulator` and each listener worker's
    :class:`WorkerRegulator` are one of these: the gate reads tokens from
    ``fd`` (the pipe's read end, inherited by workers), capacity is
    ``backlogged()`` or this process's loop lag over ``in_flow_lag_limit``,
    and the session cap learns from this process's loop and live sessions.
    """

    def __init__(
        self,
        fd: int,
        settings: FlowSettings,
        *,
        lag: LoopLag,
        backlogged: Callable[[], bool],
    ) -> None:
        """``fd``: the token pipe's read end; ``backlogged``: over in_flow_backlog_limit now."""
        self.settings = settings
        self.lag = lag
        self.backlogged = backlogged
        self.gate = TokenGate(fd, delay=settings.in_flow_delay)
        self.gate.overloaded = self.overloaded
        self.gate.session_full = self.session_full
        self.cap = SessionCap(ceiling=settings.session_limit, lag_limit=settings.lag_limit)
        self.sessions: Callable[[], int] = lambda: 0  # live SMTP sessions (set by the owner)
        self._tick: asyncio.TimerHandle | None = None

    def configure(self, settings: FlowSettings) -> None:
        """Reload: new limits apply to the next check, the new delay to the next message."""
        self.settings = settings
        self.gate.delay = settings.in_flow_delay
        self.cap.configure(settings.session_limit, settings.lag_limit)

    def overloaded(self) -> bool:
        """Over capacity now (module doc): backlog at its limit or the loop lagging."""
        if self.backlogged():
            return True
        lag_limit = self.settings.lag_limit
        return lag_limit > 0 and self.lag.now() > lag_limit

    def session_full(self) -> bool:
        """The learned session cap is reached (``qmgrd.core.sessioncap``)."""
        return not self.cap.admits(self.live())

    def live(self) -> int:
        """Live sessions, and connections admitted whose session has not begun yet."""
        return self.sessions() + self.gate.pending

    def _refill(self) -> None:
        """The queue manager's token refill (nothing in a worker)."""

    def _on_tick(self) -> None:
        self._refill()
        self.cap.update(self.lag.clock(), self.lag.take_worst(), self.live())
        self._tick = asyncio.get_running_loop().call_later(REFILL_INTERVAL, self._on_tick)

    def start(self) -> None:
        """Begin sampling the loop's lag and the ticks on the running loop."""
        self.lag.start()
        self._tick = asyncio.get_running_loop().call_later(REFILL_INTERVAL, self._on_tick)

    def stop(self) -> None:
        """Stop the ticks and the gate."""
        if self._tick is not None:
            self._tick.cancel()
            self._tick = None
        self.lag.stop()
        self.gate.close()


class WorkerRegulator(ProcessRegulator):
    """A listener worker's regulator: the inherited pipe, the backlog flag the queue manager
    sends (``["backlog", bool]``, ``qmgrd.daemon.ipc``), its own loop's lag and sessions."""

    def __init__(self, fd: int, settings: FlowSettings) -> None:
        """``fd``: the inherited read end of the queue manager's token pipe."""
        self.over_backlog = False
        super().__init__(fd, settings, lag=LoopLag(), backlogged=lambda: self.over_backlog)


class IntakeRegulator(ProcessRegulator):
    """The queue manager's regulator: the pipe it feeds, its backlog (see the module doc)."""

    def __init__(
        self,
        settings: FlowSettings,
        *,
        backlog: Callable[[], int],
        behind: Callable[[], bool],
        lag: LoopLag,
    ) -> None:
        """``backlog``: messages the queue manager holds; ``behind``: some wait to be loaded."""
        self.backlog = backlog
        self.behind = behind
        self.pipe = TokenPipe()
        super().__init__(self.pipe.read_fd, settings, lag=lag, backlogged=self.over_backlog)
        self.worker_counts: Counter[str] = Counter()  # the workers' gates' counters, summed
        self._moved = 0
        self.pipe.put(settings.token_limit)

    def live(self) -> int:
        """Sessions counted from admission: in process the owner's count is the listeners'
        ``ClientCounters`` (``assemble``), which has each connection from its admission on,
        so the gate's pending ones are in it already."""
        return self.sessions()

    def over_backlog(self) -> bool:
        """The queue manager holds ``in_flow_backlog_limit`` messages or more."""
        limit = self.settings.backlog_limit
        return bool(limit) and self.backlog() >= limit

    def incoming_moved(self) -> None:
        """The queue manager moved a message out of ``incoming/`` (the loader's hook).

        The refill runs once for all the messages moved in one pass of the event loop
        (``call_soon``): one FIONREAD and one write per pass, not per message, and the
        rule's ``moved`` counts them all (Postfix refills once per ``qmgr_loop`` pass)."""
        self._moved += 1
        if self._moved == 1:
            asyncio.get_running_loop().call_soon(self._moved_refill)

    def _moved_refill(self) -> None:
        if not self.pipe.closed:  # not stopped meanwhile
            self._refill()

    def _refill(self) -> None:
        s = self.settings
        change = refill(self.pipe.count(), s.token_limit, behind=self.behind(), moved=self._moved)
        self._moved = 0
        if change > 0:
            self.pipe.put(change)
        elif change < 0:
            self.pipe.take(-change)

    def start(self) -> None:
        """Begin sampling the loop's lag and refilling on the running loop (again after stop)."""
        if self.pipe.closed:  # a daemon started again: a fresh, full pipe
            self.pipe = TokenPipe()
            self.gate.fd = self.pipe.read_fd
            self.pipe.put(self.settings.token_limit)
        super().start()

    def stop(self) -> None:
        """Stop the ticks and the gate, close the pipe."""
        super().stop()
        self.pipe.close()


class FlowCollector(Collector):
    """Intake regulation and work-pool state, read at scrape time."""

    def __init__(self, regulator: IntakeRegulator, pool: WorkPool) -> None:
        self.regulator = regulator
        self.pool = pool

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        """The families (see each help text)."""
        gate = self.regulator.gate
        refused = CounterMetricFamily(
            "qmgrd_intake_overload_refusals",
            "Sessions and messages refused with 421 4.3.2 because the relay was over capacity.",
            value=gate.refused + self.regulator.worker_counts["refused"],
        )
        paused = CounterMetricFamily(
            "qmgrd_intake_flow_pauses",
            "Messages that waited for an in_flow_delay token, by how the wait ended.",
            labels=("outcome",),
        )
        workers = self.regulator.worker_counts
        timeouts = gate.timeouts + workers["timeout"]
        paused.add_metric(("token",), gate.paused + workers["paused"] - timeouts)
        paused.add_metric(("timeout",), timeouts)
        cap = GaugeMetricFamily(
            "qmgrd_intake_session_cap",
            "Sessions admitted at most now: learned from the event loop's lag "
            "(in_flow_lag_limit), at most smtpd_session_limit.",
        )
        cap.add_metric((), self.regulator.cap.limit)
        tokens = GaugeMetricFamily(
            "qmgrd_intake_flow_tokens", "in_flow_delay tokens in the pipe now."
        )
        tokens.add_metric((), self.regulator.pipe.count())
        counts = self.pool.counts()
        threads = GaugeMetricFamily(
            "qmgrd_workpool_workers",
            "Threads of the regulated spool work pool by state (qmgrd.core.regulator).",
            labels=("state",),
        )
        for state in ("running", "blocked", "waiting", "parked"):
            threads.add_metric((state,), getattr(counts, state))
        queued = GaugeMetricFamily("qmgrd_workpool_queued", "Spool jobs waiting for a thread.")
        queued.add_metric((), counts.queued)
        yield from (refused, paused, cap, tokens, threads, queued)


def intake_regulator(
    cfg: Config, engine: Engine, metrics: Metrics, pool: WorkPool
) -> IntakeRegulator:
    """The daemon's regulator: wired to the engine's table and loader, metrics registered;
    its loop lag is sampled less often while no session is live and the engine is idle."""
    table = engine.ctx.table
    regulator = IntakeRegulator(
        FlowSettings.from_config(cfg),
        backlog=lambda: len(table),
        behind=lambda: table.waiting > 0,
        lag=LoopLag(registry=metrics.registry),
    )
    engine.ctx.incoming_moved = regulator.incoming_moved
    # Nothing in flight (no session, nothing known to the engine): the lag is sampled less
    # often (qmgrd.daemon.looplag; an idle queue manager woke 100 times a second).
    regulator.lag.idle = lambda: regulator.live() == 0 and engine.idle
    metrics.registry.register(FlowCollector(regulator, pool))
    return regulator
