"""Listener worker processes, started, watched, restarted, reloaded and stopped by the qmgr.

Contract
--------
``worker_count(cfg)`` reads ``smtpd_worker_processes`` (``auto``: one per CPU
core; a number; ConfigError otherwise). At most 1 means no workers: the
listener runs in the queue manager's process (``assemble.Daemon``).

``WorkerPool(config_dir, count, sockets, on_commit=..., on_lost=...,
intake=..., spool=...)``: ``sockets`` are the listening sockets the queue manager bound
(service name -> sockets, ``listener.binding.bind_listener``), inherited by
every worker (Postfix's master hands its smtpd processes the listening
socket the same way), so the kernel queues each new connection once and
whichever worker is free accepts it; a worker that dies loses no connection
waiting in the queue.

- ``await start()`` spawns ``count`` workers (``qmgrd.daemon.smtpd``, slot
  1..count of count+1 queue id slots; the queue manager keeps slot 0) and
  returns when each one listens; one that exits first makes it raise
  ConfigError (the worker logged why).
- Each worker's channel (``qmgrd.daemon.ipc``) is read on the loop: a commit
  calls ``on_commit(Committed)``, intake counts go to ``intake``, ``ready``
  ends the start. When a worker ends (killed, crashed) outside ``stop``, the
  exit is logged as Postfix's master logs it, ``on_lost()`` is called (the
  queue manager scans ``incoming/``: a commit whose notice the dead worker
  never sent is found there; commits are durable before the 250), the
  temporaries of its unfinished transactions are removed (the ids of its
  slot, which no live writer draws from) and the worker is started again
  after a back-off: ``RESTART_DELAY`` doubled per quick failure up to
  ``RESTART_MAX`` (a worker that lived ``STABLE`` seconds starts the count
  again).
- ``hup(accepted)`` (SIGHUP) tells every worker to reopen its log and, if the
  queue manager accepted the reload, re-read the configuration; each answers
  ``hup-done`` when it has, and ``await wait_hup(futures)`` waits for that
  (bounded), so READY=1 after a reload means every process applied it.
- ``await stop()`` sends SIGTERM to every worker (they stop accepting,
  disconnect clients and finish queued commits), reads their channels to the
  end (so every commit notice reaches the queue manager), waits ``STOP_WAIT``
  seconds, SIGKILLs what is left, then closes the listening sockets.
- Fair admission: every ``OVER_REFRESH`` seconds ``over_backlog()`` (the flow
  keys over ``qmgr_flow_backlog_limit``) is compared with what the workers
  have; a change is sent to all (``["over", keys]``), and the current set to
  a worker that starts. The regulator's backlog half (``backlogged()``: over
  ``in_flow_backlog_limit``) goes the same way (``["backlog", bool]``).
- Intake regulation: ``tokens``, the read end of the queue manager's
  ``in_flow_delay`` token pipe, is inherited by every worker like the
  listening sockets (``--tokens FD``), so each worker's sessions take their
  tokens from the pipe the queue manager feeds; the workers' gate counters
  (``inflow:`` counts) are added to ``inflow``.
- Per-client limits: ``anvil`` (``qmgrd.daemon.anvil``) answers the
  workers' ``anvil`` requests (connection and AUTH counts over every worker,
  as Postfix's anvil server); a worker's counts go when its channel ends.
- Per-worker metrics: its ``load`` messages (session cap, loop lag) and
  sessions go to ``intake.workers`` (``metrics_intake.WorkerLoad``).
- ``pids`` and ``sessions`` show the live workers (control and tests).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import sys
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from qmgrd.config import Config
from qmgrd.daemon.anvil import Anvil
from qmgrd.daemon.ipc import apply_counts, commit_from, encode, inflow_counts, parse
from qmgrd.daemon.metrics_intake import IntakeMetrics
from qmgrd.errors import ConfigError, SpoolError
from qmgrd.listener.observer import Committed
from qmgrd.log import get_logger
from qmgrd.spool import Spool
from qmgrd.spool.queueid import queue_id_slot

__all__ = ["WorkerPool", "worker_count"]

RESTART_DELAY = 0.5  # seconds before the first restart of a dead worker
RESTART_MAX = 30.0  # the longest back-off between restarts
STABLE = 30.0  # a worker that lived this long failed "slowly": back-off starts again
START_WAIT = 60.0  # seconds a worker may take to listen
STOP_WAIT = 20.0  # seconds workers get to stop after SIGTERM (sessions get 10 s of it)
HUP_WAIT = 10.0  # seconds a reload waits for the workers to apply it
OVER_REFRESH = 0.25  # seconds between looks at the flows over their backlog limit
_READ_LIMIT = 1 << 20  # longest channel line


def worker_count(cfg: Config) -> int:
    """``smtpd_worker_processes`` as a number (module doc)."""
    text = cfg.get_str("smtpd_worker_processes").strip()
    if text == "auto":
        return os.cpu_count() or 1
    if not text.isdigit() or int(text) > 256:
        raise ConfigError(
            f"smtpd_worker_processes: {text!r} is not 'auto' or a number from 0 to 256"
        )
    return int(text)


@dataclass(slots=True, eq=False)
class _Worker:
    """One live worker process."""

    slot: int
    proc: asyncio.subprocess.Process
    writer: asyncio.StreamWriter
    ready: asyncio.Future[None]
    started: float
    sessions: int = 0
    reader: asyncio.Task[None] | None = None
    hups: list[asyncio.Future[None]] = field(default_factory=list)  # sent, not yet done


class WorkerPool:
    """The listener worker processes of one daemon (see the module doc)."""

    def __init__(
        self,
        config_dir: Path,
        count: int,
        sockets: Mapping[str, Sequence[socket.socket]],
        *,
        on_commit: Callable[[Committed], None],
        on_lost: Callable[[], None],
        intake: IntakeMetrics | None = None,
        spool: Spool,
        over_backlog: Callable[[], frozenset[str]] = frozenset,
        tokens: int | None = None,
        backlogged: Callable[[], bool] = lambda: False,
        inflow: Counter[str] | None = None,
    ) -> None:
        """Prepare ``count`` workers serving ``sockets`` (nothing runs before ``start``)."""
        self.config_dir = config_dir
        self.count = count
        self.sockets = sockets
        self.on_commit = on_commit
        self.on_lost = on_lost
        self.intake = intake
        self.spool = spool
        self.over_backlog = over_backlog
        self.tokens = tokens  # regulator: the in_flow_delay pipe's read end (inherited)
        self.backlogged = backlogged  # regulator: over in_flow_backlog_limit
        self.inflow = inflow  # regulator: the workers' gate counters, summed
        self._over: frozenset[str] = frozenset()
        self._backlog = False
        self._refresh: asyncio.Task[None] | None = None
        self.workers: dict[int, _Worker] = {}
        self.anvil = Anvil()  # per-client limits over every worker (qmgrd.daemon.anvil)
        self.log = get_logger("master")
        self._stopping = False
        self._started = False  # start() returned: a worker that dies is restarted
        self._failures: dict[int, int] = {}
        self._restarts: set[asyncio.Task[None]] = set()

    @property
    def pids(self) -> list[int]:
        """The live workers' process ids."""
        return [w.proc.pid for w in self.workers.values()]

    @property
    def sessions(self) -> int:
        """SMTP sessions in progress over every worker (as last reported)."""
        return sum(w.sessions for w in self.workers.values())

    async def start(self) -> None:
        """Start every worker and wait until each one listens (module doc)."""
        try:
            for slot in range(1, self.count + 1):
                await self._spawn(slot)
            async with asyncio.timeout(START_WAIT):
                for worker in list(self.workers.values()):
                    await worker.ready
            self._started = True
            self._refresh = asyncio.get_running_loop().create_task(self._refresh_over())
        except BaseException:
            await self.stop()
            raise

    async def _spawn(self, slot: int) -> _Worker:
        ours, theirs = socket.socketpair()
        fds = [theirs.fileno()]
        args = [
            sys.executable, "-m", "qmgrd.daemon.smtpd", "-c", str(self.config_dir),
            "--channel", str(theirs.fileno()), "--slot", str(slot),
            "--slots", str(self.count + 1), "--parent", str(os.getpid()),
            "--spool", str(self.spool.root),
        ]  # fmt: skip
        if self.tokens is not None:  # regulator: every worker reads the same token pipe
            args += ["--tokens", str(self.tokens)]
            fds.append(self.tokens)
        for service, socks in self.sockets.items():
            args += ["--listen", f"{service}=" + ",".join(str(s.fileno()) for s in socks)]
            fds += [s.fileno() for s in socks]
        env = {k: v for k, v in os.environ.items() if k != "NOTIFY_SOCKET"}
        try:
            proc = await asyncio.create_subprocess_exec(*args, pass_fds=fds, env=env)
        finally:
            theirs.close()
        reader, writer = await asyncio.open_unix_connection(sock=ours, limit=_READ_LIMIT)
        loop = asyncio.get_running_loop()
        worker = _Worker(slot, proc, writer, loop.create_future(), time.monotonic())
        self.workers[slot] = worker
        worker.reader = loop.create_task(self._read(worker, reader))
        return worker

    async def _read(self, worker: _Worker, reader: asyncio.StreamReader) -> None:
        """Handle the worker's messages until its channel ends, then see to its exit."""
        try:
            while line := await reader.readline():
                self._handle(worker, line)
        except (ConnectionError, ValueError) as exc:  # ValueError: a line over the limit
            self.log.error("listener worker channel failed", pid=worker.proc.pid, error=str(exc))
        self._channel_ended(worker)
        status = await worker.proc.wait()
        worker.writer.close()
        for future in worker.hups:
            _settle(future)
        self.workers.pop(worker.slot, None)
        if not worker.ready.done():
            worker.ready.set_exception(
                ConfigError(f"the SMTP listener process {_describe(status)} before listening")
            )
            worker.ready.exception()  # retrieved: start() raises it or has gone
        if self._stopping or not self._started:
            return
        self.log.warning(
            f"process qmgrd/smtpd pid {worker.proc.pid} {_describe(status)}; restarting it"
        )
        self.on_lost()
        await self._remove_temporaries(worker.slot)
        quick = time.monotonic() - worker.started < STABLE
        failures = self._failures.get(worker.slot, 0) + 1 if quick else 0
        self._failures[worker.slot] = failures
        delay = min(RESTART_MAX, RESTART_DELAY * 2 ** max(0, failures - 1))
        task = asyncio.get_running_loop().create_task(self._restart(worker.slot, delay))
        self._restarts.add(task)
        task.add_done_callback(self._restarts.discard)

    async def _remove_temporaries(self, slot: int) -> None:
        """The dead worker's unfinished queue files (its slot's ids: no live writer's)."""
        slots, now = self.count + 1, time.time()
        try:
            removed = await asyncio.to_thread(
                self.spool.remove_temp_files, lambda qid: queue_id_slot(qid, slots, now) == slot
            )
        except SpoolError as exc:
            self.log.warning("cannot remove a dead worker's temporary files", error=str(exc))
            return
        if removed:
            self.log.info("removed a dead worker's unfinished queue files", count=removed)

    async def _restart(self, slot: int, delay: float) -> None:
        await asyncio.sleep(delay)
        if self._stopping:
            return
        try:
            await self._spawn(slot)
        except OSError as exc:  # fork failed (memory, process limit): try again later
            self.log.error("cannot start an SMTP listener process", error=str(exc))
            task = asyncio.get_running_loop().create_task(self._restart(slot, RESTART_MAX))
            self._restarts.add(task)
            task.add_done_callback(self._restarts.discard)

    def _handle(self, worker: _Worker, line: bytes) -> None:
        try:
            fields = parse(line)
            kind = fields[0]
            if kind == "c":
                self.on_commit(commit_from(fields))
            elif kind == "anvil":
                if (answer := self.anvil.message(worker.slot, fields)) is not None:
                    worker.writer.write(answer)
            elif kind == "s":
                if self.intake is not None:
                    apply_counts(self.intake, fields[1])
                if self.inflow is not None:
                    self.inflow.update(inflow_counts(fields[1]))
                worker.sessions = int(fields[2])
                if self.intake is not None:
                    self.intake.sessions.set(self.sessions)
                    self.intake.workers.sessions[worker.slot] = worker.sessions
            elif kind == "load":
                if self.intake is not None:
                    self.intake.workers.load(worker.slot, fields)
            elif kind == "hup-done":
                if worker.hups:
                    _settle(worker.hups.pop(0))
            elif kind == "ready":
                if not worker.ready.done():
                    worker.ready.set_result(None)
                if self._over:
                    worker.writer.write(encode("over", sorted(self._over)))
                if self._backlog:
                    worker.writer.write(encode("backlog", True))
            else:
                raise ValueError(f"unknown notify message {kind!r}")
        except (ValueError, TypeError, IndexError) as exc:
            self.log.error(
                "bad message from a listener worker", pid=worker.proc.pid, error=str(exc)
            )
        except Exception as exc:  # a bug in a handler: reported loudly, the channel goes on
            self.log.error("internal error handling a worker's message", error=repr(exc))
            asyncio.get_running_loop().call_exception_handler(
                {"message": "listener worker message failed", "exception": exc}
            )

    def _channel_ended(self, worker: _Worker) -> None:
        """The worker's channel ended (it stops or died): its per-client counts go, and its
        gauges (its successor reports its own)."""
        self.anvil.lost(worker.slot)
        if self.intake is not None:
            self.intake.workers.caps.pop(worker.slot, None)
            self.intake.workers.sessions.pop(worker.slot, None)

    async def _refresh_over(self) -> None:
        """Send the flows over their backlog to every worker when that set changes.

        A cache in other processes, so it is looked at every ``OVER_REFRESH``
        seconds (a set of flow keys; a stale answer delays or lets through one
        message, ``qmgrd.listener.flowgate``).
        """
        while True:
            await asyncio.sleep(OVER_REFRESH)
            over = self.over_backlog()
            if over != self._over:
                self._over = over
                self._broadcast(encode("over", sorted(over)))
            backlog = self.backlogged()
            if backlog != self._backlog:
                self._backlog = backlog
                self._broadcast(encode("backlog", backlog))

    def _broadcast(self, message: bytes) -> None:
        for worker in self.workers.values():
            if not worker.writer.is_closing():
                worker.writer.write(message)

    def hup(self, accepted: bool) -> list[asyncio.Future[None]]:
        """SIGHUP: every worker reopens its log, and re-reads the configuration if ``accepted``.

        Returns one future per worker, done when it has (or has gone): ``wait_hup``.
        """
        message = b'["hup",true]\n' if accepted else b'["hup",false]\n'
        loop = asyncio.get_running_loop()
        done: list[asyncio.Future[None]] = []
        for worker in self.workers.values():
            if not worker.writer.is_closing():
                worker.writer.write(message)
                future = loop.create_future()
                worker.hups.append(future)
                done.append(future)
        return done

    async def wait_hup(self, done: list[asyncio.Future[None]]) -> None:
        """Wait (at most ``HUP_WAIT`` seconds) until the workers applied a ``hup``."""
        if done:
            await asyncio.wait(done, timeout=HUP_WAIT)

    async def stop(self) -> None:
        """Stop every worker (SIGTERM, then SIGKILL after ``STOP_WAIT``), close the sockets."""
        self._stopping = True
        for task in list(self._restarts):
            task.cancel()
        if self._refresh is not None:
            self._refresh.cancel()
        workers = list(self.workers.values())
        for worker in workers:
            _signal(worker.proc, signal.SIGTERM)
        readers: list[Any] = [w.reader for w in workers if w.reader is not None]
        if readers:
            _done, pending = await asyncio.wait(readers, timeout=STOP_WAIT)
            for worker in workers:
                if worker.reader in pending:
                    self.log.warning(
                        "SMTP listener process did not stop: killed", pid=worker.proc.pid
                    )
                    _signal(worker.proc, signal.SIGKILL)
            if pending:
                await asyncio.wait(pending, timeout=STOP_WAIT)
        for socks in self.sockets.values():
            for sock in socks:
                sock.close()


def _settle(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def _signal(proc: asyncio.subprocess.Process, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(signum)


def _describe(status: int) -> str:
    """An exit status as Postfix's master words it."""
    if status < 0:
        return f"killed by signal {-status}"
    return f"exit status {status}"
