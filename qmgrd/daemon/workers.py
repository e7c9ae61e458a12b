"""Listener worker processes, started, watched, restarted, reloaded and stopped by the qmgr.

Contract
--------
``worker_count(cfg)`` reads ``smtpd_worker_processes`` (``auto``: one per CPU
core; a number; ConfigError otherwise). At most 1 means no workers: the
listener runs in the queue manager's process (``assemble.Daemon``).

``WorkerPool(config_dir, count, sockets, on_commit=..., on_lost=...,
intake=..., spool=...)``: ``sockets`` are the listening sockets the queue manager bound
(service name -> sockets, ``listener.server.bind_listener``), inherited by
every worker (Postfix's master hands its smtpd processes the listening
socket the same way), so the kernel queues each new connection once and
whichever worker is free accepts it; a worker that dies loses no connection
waiting in the queue.

Starting, restarting, reloading and stopping are the ``Supervisor``'s
(``qmgrd.daemon.supervise``); what is particular to listener workers:

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
- ``pids`` and ``sessions`` show the live workers (control and tests).
"""

from __future__ import annotations

import asyncio
import os
import socket
import sys
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from qmgrd.config import Config
from qmgrd.daemon.ipc import apply_counts, commit_from, encode, inflow_counts
from qmgrd.daemon.metrics_intake import IntakeMetrics
from qmgrd.daemon.supervise import Child, Supervisor
from qmgrd.errors import ConfigError, SpoolError
from qmgrd.listener.observer import Committed
from qmgrd.spool import Spool
from qmgrd.spool.queueid import queue_id_slot

__all__ = ["WorkerPool", "worker_count"]

OVER_REFRESH = 0.25  # seconds between looks at the flows over their backlog limit


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


class WorkerPool(Supervisor):
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
        super().__init__(count, what="SMTP listener", program="smtpd")
        self.config_dir = config_dir
        self.sockets = sockets
        self.on_commit = on_commit
        self.lost = on_lost
        self.intake = intake
        self.spool = spool
        self.over_backlog = over_backlog
        self.tokens = tokens  # regulator: the in_flow_delay pipe's read end (inherited)
        self.backlogged = backlogged  # regulator: over in_flow_backlog_limit
        self.inflow = inflow  # regulator: the workers' gate counters, summed
        self._over: frozenset[str] = frozenset()
        self._backlog = False
        self._refresh: asyncio.Task[None] | None = None

    @property
    def sessions(self) -> int:
        """SMTP sessions in progress over every worker (as last reported)."""
        return sum(w.sessions for w in self.workers.values())

    async def start(self) -> None:
        """Start every worker and wait until each one listens (module doc)."""
        await super().start()
        self._refresh = asyncio.get_running_loop().create_task(self._refresh_over())

    def command(self, slot: int, channel: int) -> tuple[list[str], list[int]]:
        """``python -m qmgrd.daemon.smtpd`` with the sockets and the token pipe."""
        fds = [channel]
        args = [
            sys.executable, "-m", "qmgrd.daemon.smtpd", "-c", str(self.config_dir),
            "--channel", str(channel), "--slot", str(slot),
            "--slots", str(self.count + 1), "--parent", str(os.getpid()),
            "--spool", str(self.spool.root),
        ]  # fmt: skip
        if self.tokens is not None:  # regulator: every worker reads the same token pipe
            args += ["--tokens", str(self.tokens)]
            fds.append(self.tokens)
        for service, socks in self.sockets.items():
            args += ["--listen", f"{service}=" + ",".join(str(s.fileno()) for s in socks)]
            fds += [s.fileno() for s in socks]
        return args, fds

    async def on_lost(self, child: Child) -> None:
        """Scan ``incoming/`` for commits whose notice never came; remove its temporaries."""
        self.lost()
        await self._remove_temporaries(child.slot)

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

    def handle(self, child: Child, fields: list[Any]) -> None:
        """Commit notices and intake counts."""
        kind = fields[0]
        if kind == "c":
            self.on_commit(commit_from(fields))
        elif kind == "s":
            if self.intake is not None:
                apply_counts(self.intake, fields[1])
            if self.inflow is not None:
                self.inflow.update(inflow_counts(fields[1]))
            child.sessions = int(fields[2])
            if self.intake is not None:
                self.intake.sessions.set(self.sessions)
        else:
            raise ValueError(f"unknown notify message {kind!r}")

    def on_ready(self, child: Child) -> None:
        """Send a new worker the flows over their backlog and the backlog flag."""
        if self._over:
            child.writer.write(encode("over", sorted(self._over)))
        if self._backlog:
            child.writer.write(encode("backlog", True))

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
                self.broadcast(encode("over", sorted(over)))
            backlog = self.backlogged()
            if backlog != self._backlog:
                self._backlog = backlog
                self.broadcast(encode("backlog", backlog))

    async def stop(self) -> None:
        """Stop every worker (``Supervisor.stop``), then close the listening sockets."""
        if self._refresh is not None:
            self._refresh.cancel()
        await super().stop()

    def on_stopped(self) -> None:
        """Close the listening sockets."""
        for socks in self.sockets.values():
            for sock in socks:
                sock.close()
