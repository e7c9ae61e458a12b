"""The composition root: build the daemon's parts from a `Config` and run them.

``create_agents``, ``create_engine`` and ``reload_engine`` (``qmgrd.daemon.wiring``,
exported here) build the engine and its agents from a ``Config`` and apply a
reload to them.

``Daemon`` is the whole daemon on one event loop: spool, engine, control
socket, metrics endpoints, the maildrop pickup and the SMTP listener, both
running cleanup (``CleanupSettings``, built at start and on reload; a bad
header_checks action or table stops the start with a ConfigError). ``qmgrd run`` (``run.serve``) and
the end-to-end tests build it the same way; tests may pass a fake clock, a
spool without fsync and their own agents. ``start`` brings the parts up in
the order mail safety needs, ``stop`` takes them down in reverse:

1. the spool directories and the maildrop directory; dead writers'
   temporaries are removed and the maildrop is picked up into
   ``incoming/``; then the engine, which recovers ``active/`` and scans
   ``incoming/`` (finding the picked-up mail) before it delivers;
2. the control socket (operator commands wait for the engine to start),
   then the pickup service (``sendmail``'s wake-ups);
3. once recovery is over (it removes dead writers' temporaries, which could
   race a live commit): the metrics endpoints, then the listener, whose
   commits wake the engine. Only then is mail accepted.

Listener processes (``workers`` > 1, ``qmgrd run`` passes
``smtpd_worker_processes``; docs/processes.md): in step 3 the daemon binds
the listening sockets and starts a ``WorkerPool`` whose processes serve them
(listener, cleanup and spool commits each on its own loop); their commit
notices reach the same ``_committed`` as the in-process listener's, a dead
worker's missed notice is covered by an ``incoming/`` scan. This process
keeps the engine, the control socket, metrics and pickup. With ``workers``
0 or 1 (the default here: tests), the listener runs on this loop.

An engine that fails during start-up makes ``start`` raise (everything started
is closed again); one that fails later makes ``wait`` raise.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Callable

from qmgrd.cleanup import CleanupSettings
from qmgrd.config import Config, load_config
from qmgrd.daemon.admitting import EngineFlowGate
from qmgrd.daemon.clock import Clock, SystemClock
from qmgrd.daemon.control import ControlServer, control_socket_path, start_control_server
from qmgrd.daemon.dpool import DeliveryPool, remote_agents
from qmgrd.daemon.intakeflow import FlowSettings, intake_regulator
from qmgrd.daemon.metrics import (
    Metrics,
    spool_oldest_ages,
    spool_queue_counts,
    start_metrics_server,
)
from qmgrd.daemon.metrics_intake import IntakeMetrics
from qmgrd.daemon.pickup import Pickup
from qmgrd.daemon.wiring import create_agents, create_engine, reload_engine
from qmgrd.daemon.workers import WorkerPool
from qmgrd.daemon.workpool import WorkPool
from qmgrd.delivery.agent import Agent
from qmgrd.errors import ConfigError
from qmgrd.listener import ListenerHandle
from qmgrd.listener.flowgate import FlowFacts
from qmgrd.listener.group import ListenerGroup
from qmgrd.listener.observer import Committed
from qmgrd.listener.server import bind_listener
from qmgrd.listener.services import listener_settings
from qmgrd.log import get_logger
from qmgrd.spool import QueueIdGenerator, Spool

__all__ = ["Daemon", "create_agents", "create_engine", "reload_engine"]

class Daemon:
    """The daemon's parts on one event loop (see the module docstring)."""

    def __init__(
        self,
        cfg: Config,
        *,
        clock: Clock | None = None,
        fsync: bool = True,
        agents: dict[str, Agent] | None = None,
        workers: int = 0,
        delivery_workers: int = 0,
    ) -> None:
        """Build (not start) every part; ``agents`` replaces master.cf's agents (tests).

        ``workers`` > 1: that many listener processes; ``delivery_workers`` > 0 (without
        ``agents``): that many delivery processes (module doc).
        """
        self.cfg = cfg
        self.delivery: DeliveryPool | None = None  # delivery processes (qmgrd.daemon.dpool)
        self._make_agents: Callable[[Config], dict[str, Agent]] = create_agents
        if delivery_workers > 0 and agents is None:
            pool = self.delivery = DeliveryPool(cfg.config_dir, delivery_workers)
            self._make_agents = lambda c: remote_agents(c, pool, create_agents)
            agents = self._make_agents(cfg)
        self.workers = workers if workers > 1 else 0
        self.spool = Spool(
            cfg.get_path("queue_directory"),
            fsync=fsync,
            ids=QueueIdGenerator(  # slot 0 of the ids shared with the listener workers
                long_ids=cfg.get_bool("enable_long_queue_ids"), slots=self.workers + 1
            ),
        )
        self.clock: Clock = clock or SystemClock()
        self.metrics = Metrics(
            queue_counts_fn=lambda: spool_queue_counts(self.spool.root),
            queue_ages_fn=lambda: spool_oldest_ages(self.spool, self.clock.now()),
        )
        self.engine = create_engine(cfg, spool=self.spool, clock=self.clock, agents=agents)
        self.workpool = WorkPool()  # regulator: the spool's blocking work (qmgrd.daemon.workpool)
        self.engine.ctx.io.pool = self.workpool
        self.intake = intake_regulator(cfg, self.engine, self.metrics, self.workpool)  # regulator
        self.engine.metrics = self.metrics
        self.metrics.status_fn = self.engine.snapshot
        self.cleanup = CleanupSettings.from_config(cfg)
        self.pickup = Pickup(
            self.spool,
            cfg.get_path("maildrop_directory"),
            self.cleanup,
            notify=self.engine.notify_incoming,
            size_limit=cfg.get_int("message_size_limit"),
            warn_delay=cfg.get_time("delay_warning_time"),
        )
        self._pickup_stop = asyncio.Event()
        self.control: ControlServer | None = None
        self.listeners: ListenerGroup | None = None  # in-process listeners
        self.pool: WorkerPool | None = None  # listener processes
        self._hups: list[asyncio.Future[None]] = []  # workers applying a reload
        self._task: asyncio.Task[None] | None = None
        self._stack = contextlib.AsyncExitStack()

    @property
    def task(self) -> asyncio.Task[None]:
        """The engine's task (after ``start``)."""
        assert self._task is not None, "the daemon was not started"
        return self._task

    async def start(self, *, listen: bool = True) -> None:
        """Start every part in order; with ``listen`` False, no SMTP listener (tests)."""
        self.spool.ensure_dirs()
        self.pickup.ensure_dir()
        self._stack.callback(self.workpool.close)  # regulator: last to stop
        self.intake.start()
        self._stack.callback(self.intake.stop)
        await asyncio.to_thread(self._recover_pickup)  # before the engine's incoming scan
        if self.delivery is not None:  # ready before the first delivery, stopped after the last
            try:
                await self.delivery.start()
            except BaseException:
                await self._stack.aclose()
                raise
            self._stack.push_async_callback(self.delivery.stop)
        self._stack.push_async_callback(self._close_gate)  # cluster: after the engine stops
        self._task = asyncio.get_running_loop().create_task(self.engine.run())
        self._stack.push_async_callback(self._stop_engine)
        try:
            self.control = await start_control_server(
                control_socket_path(self.spool.root), self.engine, self.spool
            )
            self._stack.push_async_callback(_close_control, self.control)
            await self._started()
            self._pickup_stop.clear()
            pickup = asyncio.get_running_loop().create_task(self.pickup.run(self._pickup_stop))
            self._stack.push_async_callback(self._stop_pickup, pickup)
            for host, port in self.cfg.get_hostports("metrics_listen"):
                try:
                    server = await start_metrics_server(host, port, self.metrics)
                except OSError as exc:
                    raise ConfigError(
                        f"metrics_listen: cannot listen on {host}:{port}: {exc.strerror or exc}"
                    ) from exc
                self._stack.push_async_callback(server.aclose)
            if listen:
                await self._start_listeners()
        except BaseException:
            await self._stack.aclose()
            raise

    # -- listeners: in this process, or in worker processes (qmgrd.daemon.workers) ---------

    @property
    def listener(self) -> ListenerHandle | None:
        """The in-process smtpd_listen listener (None with workers or before start)."""
        return None if self.listeners is None else self.listeners.main

    @property
    def services(self) -> dict[str, ListenerHandle]:
        """The in-process master.cf inet listeners by name."""
        return {} if self.listeners is None else self.listeners.services

    def _committed(self, c: Committed) -> None:
        """A listener (in process or a worker) committed ``c`` to incoming/ (with its flow)."""
        self.engine.notify_incoming(c.queue_id, FlowFacts(c.sender, c.client_addr, c.sasl_user))

    async def _start_listeners(self) -> None:
        """The smtpd_listen listener, then one per master.cf inet service (shared commits)."""
        settings = listener_settings(self.cfg, cleanup=self.cleanup)  # certificates checked
        if not self.workers:
            self.listeners = await ListenerGroup.start(
                settings,
                self.spool,
                on_commit=self._committed,
                observer=self.metrics.intake,
                gate=EngineFlowGate(self.engine),
            )
            self._stack.push_async_callback(self._close_listener)
            self.listeners.main.committer.pool = self.workpool  # regulator: fsync batches
            handles = [self.listeners.main, *self.listeners.services.values()]
            for handle in handles:
                handle.ctx.inflow = self.intake.gate  # regulator
            self.intake.sessions = lambda: sum(h.ctx.counters.total for h in handles)
            return
        sockets: dict[str, list[socket.socket]] = {}
        try:
            for item in settings:
                sockets[item.service] = bind_listener(item)
        except BaseException:
            for socks in sockets.values():
                for sock in socks:
                    sock.close()
            raise
        intake = self.metrics.intake
        self.pool = WorkerPool(
            self.cfg.config_dir,
            self.workers,
            sockets,
            on_commit=self._committed,
            on_lost=self.engine.request_incoming_scan,
            intake=intake if isinstance(intake, IntakeMetrics) else None,
            spool=self.spool,
            over_backlog=lambda: self.engine.ctx.table.admission.over_backlog_keys(),
            tokens=self.intake.pipe.read_fd,  # regulator: the workers take tokens from it
            backlogged=self.intake.over_backlog,
            inflow=self.intake.worker_counts,
        )
        await self.pool.start()  # stops what it started if it fails
        self._stack.push_async_callback(self.pool.stop)

    async def _started(self) -> None:
        """Wait for the engine's startup recovery (or its failure, which is then raised)."""
        started = asyncio.ensure_future(self.engine.wait_started())
        await asyncio.wait({started, self.task}, return_when=asyncio.FIRST_COMPLETED)
        if not started.done():
            started.cancel()
            self.task.result()

    async def wait(self, stop: asyncio.Event) -> None:
        """Run until ``stop`` is set; an engine that ends on its own raises its error here."""
        stop_wait = asyncio.ensure_future(stop.wait())
        try:
            done, _ = await asyncio.wait(
                {stop_wait, self.task}, return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            stop_wait.cancel()
        if self.task in done:
            self.task.result()  # an engine crash is fatal: surface it

    def reload(self) -> bool:
        """SIGHUP: apply the configuration files again; False (old one kept) if refused.

        The listeners' settings (certificates included) are built first: a
        missing or mismatched certificate refuses the whole reload. New
        sessions then use the new settings (a renewed certificate). A changed
        set of listen addresses or inet services needs a restart (logged).
        """
        accepted = self._reload()
        for pool in (self.pool, self.delivery):  # workers re-read the configuration if accepted
            if pool is not None:
                self._hups += pool.hup(accepted)
        return accepted

    async def wait_reloaded(self) -> None:
        """After ``reload``: wait (bounded) until every worker process has applied it."""
        hups, self._hups = self._hups, []
        pool = self.pool or self.delivery  # either waits for every worker's futures
        if pool is not None:
            await pool.wait_hup(hups)

    def _reload(self) -> bool:
        listeners = None
        try:
            loaded = load_config(self.cfg.config_dir)
            cleanup = CleanupSettings.from_config(loaded)  # tables and header_checks actions
            if self.listeners is not None or self.pool is not None:
                listeners = listener_settings(loaded, cleanup=cleanup)
        except (ConfigError, ValueError) as exc:
            get_logger("master").error(f"reload refused, keeping the running configuration: {exc}")
            return False
        new_cfg = reload_engine(self.engine, self.cfg.config_dir, self.cfg, self._make_agents)
        if new_cfg is None:
            return False
        self.cfg = new_cfg
        self.intake.configure(FlowSettings.from_config(new_cfg))  # regulator
        self.cleanup = cleanup
        self.pickup.settings = cleanup
        if self.listeners is not None and listeners is not None:
            self.listeners.update(listeners)
        return True

    async def stop(self) -> None:
        """Stop accepting mail, close the control socket, then let the engine drain."""
        await self._stack.aclose()

    def _recover_pickup(self) -> None:
        """Start-up (worker thread): dead writers' temporaries, then the maildrop backlog."""
        self.spool.remove_temp_files()
        self.pickup.recover()

    async def _stop_pickup(self, task: asyncio.Task[None]) -> None:
        self._pickup_stop.set()
        await task

    async def _close_gate(self) -> None:
        if self.engine.ctx.gate is not None:
            await self.engine.ctx.gate.close()

    async def _stop_engine(self) -> None:
        self.engine.stop()
        if self._task is not None and not self._task.done():
            await self._task

    async def _close_listener(self) -> None:
        if self.listeners is not None:
            await self.listeners.aclose()
            self.listeners = None


async def _close_control(control: ControlServer) -> None:
    control.close()
    await control.wait_closed()
