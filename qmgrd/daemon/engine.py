"""The engine: the loop that drives the pure scheduler, the spool and the agents.

Theory of operation (DESIGN §4)
-------------------------------
One coroutine, :meth:`Engine.run`, owns every scheduling decision. Each pass of
its loop reads the clock once, then:

1. runs the scheduler's due timers, the finishes and the incoming rescan whose
   retry time has come and, every ``queue_run_delay``, starts a deferred-queue
   scan;
2. applies the scheduler's events (finished messages, recipients deferred at a
   dead destination, state changes for the log);
3. feeds the active queue (``qmgrd.daemon.loading``);
4. serves the scheduler's read requests (recipient batches);
5. drains: starts one delivery per entry the scheduler selects
   (``qmgrd.daemon.dispatch``).

Then it sleeps until something happens: a delivery or a file job completes, the
listener commits a message, a control request arrives, or the next deadline
passes. Nothing polls.

The parts, one responsibility each, share an ``EngineContext``:
``table`` (one checked state per message), ``recovery``, ``loading``,
``dispatch``, ``outcomes`` (done marks, reasons, the log line per recipient),
``finishing`` (delete, defer, expire), ``notices`` (bounded composition),
``operations`` (the operator's commands), ``snapshot`` (status) and
``supervisor`` (the tasks, and what a failure in one means).

Bugs are loud: an ``InvariantError`` (or any exception that escapes one of the
engine's tasks: every per-message step catches its own failures) stops the
loop; :meth:`run` then settles in-flight work and raises ``InvariantError``
with the cause, so the daemon exits non-zero with a clear message and systemd
restarts it (recovery makes that safe).

The ordering rules that keep mail safe are in ``outcomes`` and ``finishing``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping

from qmgrd.core.params import TransportParams
from qmgrd.core.resolve import Resolver
from qmgrd.core.scheduler import Scheduler
from qmgrd.daemon.admitting import AdmissionSettings
from qmgrd.daemon.clock import Clock
from qmgrd.daemon.context import DeliveryObserver, EngineContext, EngineStats
from qmgrd.daemon.dispatch import Dispatcher, close_agents
from qmgrd.daemon.enginectl import EngineControl
from qmgrd.daemon.events import apply_events
from qmgrd.daemon.finishing import Finisher
from qmgrd.daemon.iobatch import IoBatcher
from qmgrd.daemon.loading import Loader
from qmgrd.daemon.notices import NoticeComposer
from qmgrd.daemon.operations import Operator
from qmgrd.daemon.outcomes import Recorder
from qmgrd.daemon.recovery import recover
from qmgrd.daemon.settings import EngineSettings
from qmgrd.daemon.supervisor import TaskSupervisor
from qmgrd.daemon.table import ActiveMessage, MessageState
from qmgrd.delivery.agent import Agent
from qmgrd.errors import InvariantError
from qmgrd.listener.flowgate import FlowFacts
from qmgrd.spool import Spool

__all__ = ["ActiveMessage", "DeliveryObserver", "Engine", "EngineStats"]


class Engine(EngineControl):
    """Drives the scheduler: feed, read, select, deliver, complete (see the module doc)."""

    def __init__(
        self,
        *,
        settings: EngineSettings,
        spool: Spool,
        scheduler: Scheduler,
        resolver: Resolver,
        transport_params: Callable[[str], TransportParams],
        agents: Mapping[str, Agent],
        clock: Clock,
        io: IoBatcher | None = None,
    ) -> None:
        """Collaborators are passed in so tests can hand in fakes (STYLE §9)."""
        self._kick = asyncio.Event()
        self.tasks = TaskSupervisor(self._kick.set, self._fail)
        self._fatal: BaseException | None = None
        self.ctx = ctx = EngineContext(
            settings=settings,
            spool=spool,
            scheduler=scheduler,
            resolver=resolver,
            transport_params=transport_params,
            agents=dict(agents),
            clock=clock,
            io=io or IoBatcher(),
            spawn=self.tasks.spawn,
            kick=self._kick.set,
        )
        self.log = ctx.log
        self.loader = Loader(ctx)
        self.recorder = Recorder(ctx)
        self.dispatcher = Dispatcher(ctx, self.recorder)
        self.operator = Operator(
            ctx, notify_incoming=self.notify_incoming, enqueue_deferred=self._enqueue_deferred
        )
        self.composer = NoticeComposer(ctx)
        self.finisher = Finisher(
            ctx,
            self.composer,
            notify_incoming=self.notify_incoming,
            rescan_incoming=self.loader.request_rescan,
            op_done=self.operator.op_done,
        )
        self._deferred_scan_due = 0.0
        self._flush_next_scan = False
        self._started_at = clock.now()
        self._passes = 0
        self._started = asyncio.Event()
        self._pass_cond = asyncio.Condition()
        self._loop: asyncio.AbstractEventLoop | None = None  # run()'s

    # ------------------------------------------------------------------ collaborators

    @property
    def scheduler(self) -> Scheduler:
        """The pure scheduler."""
        return self.ctx.scheduler

    @property
    def stats(self) -> EngineStats:
        """The engine's counters."""
        return self.ctx.stats

    @property
    def agents(self) -> dict[str, Agent]:
        """Delivery agents by transport name."""
        return self.ctx.agents

    @agents.setter
    def agents(self, agents: Mapping[str, Agent]) -> None:
        self.ctx.agents = dict(agents)

    @property
    def metrics(self) -> DeliveryObserver | None:
        """Where outcomes are reported for metrics (None: nowhere)."""
        return self.ctx.metrics

    @metrics.setter
    def metrics(self, metrics: DeliveryObserver | None) -> None:
        self.ctx.metrics = metrics

    @property
    def retry_delay(self) -> float:
        """Seconds before failed file work (disk full, EIO) is tried again."""
        return self.ctx.retry_delay

    @retry_delay.setter
    def retry_delay(self, seconds: float) -> None:
        self.ctx.retry_delay = seconds

    # ------------------------------------------------------------------ wakeups

    def wakeup(self) -> None:
        """Make the loop run a pass now (after an event outside the engine)."""
        self._kick.set()

    def notify_incoming(self, queue_id: str, facts: FlowFacts | None = None) -> None:
        """``queue_id`` is in ``incoming/``: load it soon (``facts``: its flow's, if known)."""
        self.loader.enqueue(queue_id, "incoming", facts)

    def _enqueue_deferred(self, queue_id: str) -> None:
        self.loader.enqueue(queue_id, "deferred")

    def configure_admission(self, settings: AdmissionSettings) -> None:
        """Fair admission's flows and per-flow limits (start and reload; ``admitting``)."""
        self.ctx.admit_flow = settings.flow_fn()
        self.ctx.table.admission.set_limits(settings.limits)
        self._kick.set()

    def request_deferred_scan(self, *, flush: bool = False) -> None:
        """Scan ``deferred/`` at the next pass (``flush``: ignore next-attempt times)."""
        self._deferred_scan_due = 0.0
        self._flush_next_scan = self._flush_next_scan or flush
        self._kick.set()

    def request_incoming_scan(self) -> None:
        """Look at ``incoming/`` again (files dropped there by hand or by ``requeue``)."""
        self.tasks.spawn(self.loader.scan_incoming())

    def flush(self) -> None:
        """``postqueue -f``: forget dead destinations and retry every deferred message now."""
        self.ctx.scheduler.flush(self.ctx.clock.now())
        self.request_deferred_scan(flush=True)

    @property
    def idle(self) -> bool:
        """Nothing in core, nothing known to the table, no file work pending."""
        return (
            self.ctx.scheduler.message_count == 0
            and len(self.ctx.table) == 0
            and not self.tasks.busy
            and not self.loader.rescan_due
        )

    async def wait_started(self) -> None:
        """Wait until startup recovery is over: only then may new mail be accepted.

        Recovery removes the temporary files of writers that died; a listener
        started earlier could have a live commit's temporary file removed.
        """
        await self._started.wait()

    async def wait_idle(self) -> None:
        """Wait until a pass that began after this call ends with nothing in core or pending."""
        # Passes are synchronous, so any pass counted after ``start`` began after this call;
        # the kick makes sure one runs even when the engine sleeps with no deadline.
        start = self._passes
        self._kick.set()
        async with self._pass_cond:
            await self._pass_cond.wait_for(lambda: self._passes > start and self.idle)

    async def wait_until(self, predicate: Callable[[], bool]) -> None:
        """Wait until ``predicate`` holds at the end of a pass (tests bound it in time)."""
        self._kick.set()
        async with self._pass_cond:
            await self._pass_cond.wait_for(predicate)

    # ------------------------------------------------------------------ lifecycle

    async def recover(self) -> None:
        """Startup: drop dead writers' temporaries, move ``active/`` back to ``incoming/``."""
        now = self.ctx.clock.now()
        done = await self.ctx.io.submit(lambda: recover(self.ctx.spool, now))
        done.log(self.log)

    async def run(self) -> None:
        """The engine's loop; returns after :meth:`stop` once in-flight work is settled.

        Raises ``InvariantError`` after settling when a bug stopped the loop.
        """
        self._loop = asyncio.get_running_loop()
        try:
            await self.recover()
            await self.loader.scan_incoming()
        finally:
            self._started.set()
        try:
            while not self.ctx.stopping:
                self._kick.clear()
                now = self.ctx.clock.now()
                self._pass(now)
                self._passes += 1
                async with self._pass_cond:
                    self._pass_cond.notify_all()
                await self._sleep(now)
        except InvariantError as exc:
            self._fail(exc)
        finally:
            await self._shutdown()
        if self._fatal is not None:
            raise InvariantError(
                f"internal error, the daemon stops (a bug in qmgrd; the spool is safe and "
                f"the next start recovers it): {self._fatal}"
            ) from self._fatal

    def stop(self) -> None:
        """Stop dispatching; :meth:`run` returns once deliveries finish or time out."""
        self.ctx.stopping = True
        self._kick.set()

    def _fail(self, exc: BaseException) -> None:
        """A bug: log it loudly and stop the loop (run raises it once settled)."""
        if self._fatal is None:
            self._fatal = exc
            self.log.critical("internal error; stopping the daemon", error=repr(exc))
        self.stop()

    async def _sleep(self, now: float) -> None:
        if self._kick.is_set():  # more to do at once: after what else the loop has ready
            await asyncio.sleep(0)
            return
        deadlines = [
            d
            for d in (
                self.ctx.scheduler.next_deadline(),
                self._deferred_scan_due or None,
                self.ctx.table.next_retry(),
                self.loader.rescan_due or None,
                self.ctx.table.admission.next_deadline(),
            )
            if d is not None
        ]
        if not deadlines:
            await self._kick.wait()
            return
        # The next deadline kicks the loop itself: a timer per pass, no timeout context (on
        # 3.11 asyncio.timeout looks up the task and the loop, and a timeout that fires
        # cancels the task and raises through the wait; wait_for even makes a task).
        loop = self._loop or asyncio.get_running_loop()
        timer = loop.call_at(loop.time() + max(0.0, min(deadlines) - now), self._kick.set)
        try:
            await self._kick.wait()
        finally:
            timer.cancel()

    async def _shutdown(self) -> None:
        timeout = self.ctx.settings.shutdown_timeout
        await self.tasks.shutdown(timeout, self.log)
        await self.loader.settle()  # loads in flight (no task each: qmgrd.daemon.loading)
        if self.tasks.busy:  # what their callbacks started (a quarantine)
            await self.tasks.shutdown(timeout, self.log)
        await self.ctx.io.wait_idle()
        self.composer.close()
        await close_agents(self.ctx.agents.values(), self.log)

    # ------------------------------------------------------------------ one pass

    def _pass(self, now: float) -> None:
        ctx = self.ctx
        ctx.scheduler.run_timers(now)
        self.loader.run_rescan(now)
        for record in ctx.table.in_state(MessageState.RETRY):
            if record.retry_at <= now:
                ctx.table.move(record, MessageState.FINISHING)
                self.tasks.spawn(self.finisher.finish(record))
        if self._deferred_scan_due <= now and not self.loader.deferred_scan_running:
            self._deferred_scan_due = now + ctx.settings.queue_run_delay
            self.loader.deferred_scan_running = True
            self.tasks.spawn(self.loader.scan_deferred(now, flush=self._flush_next_scan))
            self._flush_next_scan = False
        self._apply_events(now)
        self.loader.feed(now)
        self.loader.serve_reads()
        self.dispatcher.drain(now)
        self._apply_events(now)

    def _apply_events(self, now: float) -> None:
        apply_events(
            self.ctx,
            now,
            finish=self.finisher.finish,
            retired=self.finisher.retired,
            defer_unattempted=self.recorder.defer_unattempted,
        )
