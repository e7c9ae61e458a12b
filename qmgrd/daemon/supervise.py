"""Worker processes of the queue manager: spawned, watched, restarted, reloaded and stopped.

Contract
--------
``Supervisor(count, what=, program=)`` is the part every kind of worker
process shares (listener workers, ``qmgrd.daemon.workers``; delivery
workers, ``qmgrd.daemon.delivery_pool``). A subclass says how to start a
worker and what its messages mean:

- ``command(slot, channel_fd)`` returns the argument vector and the file
  descriptors the worker inherits (the channel's end among them);
- ``handle(child, fields)`` gets every channel message (``qmgrd.daemon.ipc``
  framing) other than ``ready`` and ``hup-done``;
- ``on_ready(child)``: the worker said ``ready`` (send it current state);
- ``on_exit(child)``: the worker's process ended, for whatever reason (its
  channel was read to the end first);
- ``await on_lost(child)``: it ended outside ``stop`` (crash, kill): called
  after the exit is logged as Postfix's master logs it (``process
  qmgrd/PROGRAM pid N killed by signal 9; restarting it``), before the
  restart is scheduled;
- ``on_stopped()``: the end of ``stop`` (close what the workers shared).

The supervisor:

- ``await start()`` spawns ``count`` workers (slots 1..count) and returns
  when each one said ``ready``; one that exits first makes it raise
  ConfigError (the worker logged why), after stopping the others.
- restarts a worker that ended outside ``stop`` after a back-off:
  ``RESTART_DELAY`` doubled per quick failure up to ``RESTART_MAX`` (a
  worker that lived ``STABLE`` seconds starts the count again); a failed
  fork is tried again after ``RESTART_MAX``.
- ``hup(accepted)`` (SIGHUP) sends ``["hup", accepted]`` to every worker and
  returns one future per worker, done when it answered ``hup-done`` (or
  ended); ``await wait_hup(futures)`` waits for them (``HUP_WAIT`` at most).
- ``await stop()`` sends SIGTERM to every worker, reads their channels to the
  end, waits ``STOP_WAIT`` seconds, SIGKILLs what is left (logged), then
  calls ``on_stopped``. Nothing is restarted once ``stop`` began.
- ``workers`` maps slot -> live ``Child``; ``pids`` lists their processes.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import time
from dataclasses import dataclass, field
from typing import Any

from qmgrd.daemon.ipc import parse
from qmgrd.errors import ConfigError
from qmgrd.log import get_logger

__all__ = ["Child", "Supervisor", "describe_status"]

RESTART_DELAY = 0.5  # seconds before the first restart of a dead worker
RESTART_MAX = 30.0  # the longest back-off between restarts
STABLE = 30.0  # a worker that lived this long failed "slowly": back-off starts again
START_WAIT = 60.0  # seconds a worker may take to be ready
STOP_WAIT = 20.0  # seconds workers get to stop after SIGTERM (sessions get 10 s of it)
HUP_WAIT = 10.0  # seconds a reload waits for the workers to apply it
_READ_LIMIT = 1 << 20  # longest channel line


@dataclass(slots=True, eq=False)
class Child:
    """One live worker process."""

    slot: int
    proc: asyncio.subprocess.Process
    writer: asyncio.StreamWriter
    ready: asyncio.Future[None]
    started: float
    sessions: int = 0  # listener workers: SMTP sessions in progress, as last reported
    reader: asyncio.Task[None] | None = None
    hups: list[asyncio.Future[None]] = field(default_factory=list)  # sent, not yet done


class Supervisor:
    """The worker processes of one kind (see the module doc)."""

    def __init__(self, count: int, *, what: str, program: str) -> None:
        """``what`` names the workers in log lines ("SMTP listener"); ``program`` is
        the ``qmgrd/PROGRAM`` of Postfix-style exit lines ("smtpd")."""
        self.count = count
        self.what = what
        self.program = program
        self.workers: dict[int, Child] = {}
        self.log = get_logger("master")
        self._stopping = False
        self._started = False  # start() returned: a worker that dies is restarted
        self._failures: dict[int, int] = {}
        self._restarts: set[asyncio.Task[None]] = set()

    # -- what a kind of worker says -----------------------------------------------------

    def command(self, slot: int, channel: int) -> tuple[list[str], list[int]]:
        """The worker's argument vector and inherited descriptors (``channel`` among them)."""
        raise NotImplementedError

    def handle(self, child: Child, fields: list[Any]) -> None:
        """A channel message other than ``ready`` and ``hup-done``."""
        raise ValueError(f"unknown notify message {fields[0]!r}")

    def on_ready(self, child: Child) -> None:
        """The worker said ``ready``."""

    def on_exit(self, child: Child) -> None:
        """The worker's process ended (its channel read to the end)."""

    async def on_lost(self, child: Child) -> None:
        """The worker ended outside ``stop``; it is restarted after this."""

    def on_stopped(self) -> None:
        """The end of ``stop``."""

    # -- the common part ----------------------------------------------------------------

    @property
    def pids(self) -> list[int]:
        """The live workers' process ids."""
        return [w.proc.pid for w in self.workers.values()]

    async def start(self) -> None:
        """Start every worker and wait until each one is ready (module doc)."""
        try:
            for slot in range(1, self.count + 1):
                await self._spawn(slot)
            async with asyncio.timeout(START_WAIT):
                for worker in list(self.workers.values()):
                    await worker.ready
            self._started = True
        except BaseException:
            await self.stop()
            raise

    async def _spawn(self, slot: int) -> Child:
        ours, theirs = socket.socketpair()
        try:
            args, fds = self.command(slot, theirs.fileno())
            env = {k: v for k, v in os.environ.items() if k != "NOTIFY_SOCKET"}
            proc = await asyncio.create_subprocess_exec(*args, pass_fds=fds, env=env)
        finally:
            theirs.close()
        reader, writer = await asyncio.open_unix_connection(sock=ours, limit=_READ_LIMIT)
        loop = asyncio.get_running_loop()
        worker = Child(slot, proc, writer, loop.create_future(), time.monotonic())
        self.workers[slot] = worker
        worker.reader = loop.create_task(self._read(worker, reader))
        return worker

    async def _read(self, worker: Child, reader: asyncio.StreamReader) -> None:
        """Handle the worker's messages until its channel ends, then see to its exit."""
        try:
            while line := await reader.readline():
                self._dispatch(worker, line)
        except (ConnectionError, ValueError) as exc:  # ValueError: a line over the limit
            self.log.error(
                f"{self.what} worker channel failed", pid=worker.proc.pid, error=str(exc)
            )
        status = await worker.proc.wait()
        worker.writer.close()
        for future in worker.hups:
            _settle(future)
        if self.workers.get(worker.slot) is worker:
            del self.workers[worker.slot]
        self.on_exit(worker)
        if not worker.ready.done():
            what = f"the {self.what} process {describe_status(status)}"
            worker.ready.set_exception(ConfigError(f"{what} before it was ready"))
            worker.ready.exception()  # retrieved: start() raises it or has gone
        if self._stopping or not self._started:
            return
        self.log.warning(
            f"process qmgrd/{self.program} pid {worker.proc.pid} "
            f"{describe_status(status)}; restarting it"
        )
        await self.on_lost(worker)
        quick = time.monotonic() - worker.started < STABLE
        failures = self._failures.get(worker.slot, 0) + 1 if quick else 0
        self._failures[worker.slot] = failures
        delay = min(RESTART_MAX, RESTART_DELAY * 2 ** max(0, failures - 1))
        self._schedule_restart(worker.slot, delay)

    def _schedule_restart(self, slot: int, delay: float) -> None:
        task = asyncio.get_running_loop().create_task(self._restart(slot, delay))
        self._restarts.add(task)
        task.add_done_callback(self._restarts.discard)

    async def _restart(self, slot: int, delay: float) -> None:
        await asyncio.sleep(delay)
        if self._stopping:
            return
        try:
            await self._spawn(slot)
        except OSError as exc:  # fork failed (memory, process limit): try again later
            self.log.error(f"cannot start a {self.what} process", error=str(exc))
            self._schedule_restart(slot, RESTART_MAX)

    def _dispatch(self, worker: Child, line: bytes) -> None:
        try:
            fields = parse(line)
            kind = fields[0]
            if kind == "hup-done":
                if worker.hups:
                    _settle(worker.hups.pop(0))
            elif kind == "ready":
                if not worker.ready.done():
                    worker.ready.set_result(None)
                self.on_ready(worker)
            else:
                self.handle(worker, fields)
        except (ValueError, TypeError, IndexError) as exc:
            self.log.error(
                f"bad message from a {self.what} worker", pid=worker.proc.pid, error=str(exc)
            )
        except Exception as exc:  # a bug in a handler: reported loudly, the channel goes on
            self.log.error("internal error handling a worker's message", error=repr(exc))
            asyncio.get_running_loop().call_exception_handler(
                {"message": f"{self.what} worker message failed", "exception": exc}
            )

    def broadcast(self, message: bytes) -> None:
        """Send ``message`` to every live worker."""
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
        """Stop every worker (SIGTERM, then SIGKILL after ``STOP_WAIT``), then ``on_stopped``."""
        self._stopping = True
        for task in list(self._restarts):
            task.cancel()
        workers = list(self.workers.values())
        for worker in workers:
            _signal(worker.proc, signal.SIGTERM)
        readers: list[Any] = [w.reader for w in workers if w.reader is not None]
        if readers:
            _done, pending = await asyncio.wait(readers, timeout=STOP_WAIT)
            for worker in workers:
                if worker.reader in pending:
                    self.log.warning(
                        f"{self.what} process did not stop: killed", pid=worker.proc.pid
                    )
                    _signal(worker.proc, signal.SIGKILL)
            if pending:
                await asyncio.wait(pending, timeout=STOP_WAIT)
        self.on_stopped()


def _settle(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def _signal(proc: asyncio.subprocess.Process, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(signum)


def describe_status(status: int) -> str:
    """An exit status as Postfix's master words it."""
    if status < 0:
        return f"killed by signal {-status}"
    return f"exit status {status}"
