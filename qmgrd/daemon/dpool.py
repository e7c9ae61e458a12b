"""Delivery worker processes and the agent that hands them deliveries (queue manager side).

Contract
--------
``delivery_worker_count(cfg)`` is ``delivery_worker_processes`` (0: the
agents run in the queue manager's process, as without this module).

``DeliveryPool(config_dir, count)`` is a ``Supervisor``
(``qmgrd.daemon.supervise``: start, restart with back-off, SIGHUP, stop) of
``count`` processes ``qmgrd-delivery`` (``python -m qmgrd.daemon.delivery``),
each building its agents from the configuration with the factory the queue
manager uses (``wiring.create_agents``).

``await pool.deliver(request, bound)`` sends the request over the worker's
channel (``qmgrd.daemon.dwire``: the content as queue file path and byte
range) and returns the worker's ``DeliveryResult``. Which worker:

- the one of the entry's transport and nexthop (``crc32`` modulo the
  count), so the connection cache of that process keeps hitting; unless it
  is not ready (restarting) or has ``SPILL`` more deliveries in flight than
  the least busy one, which then takes it (one busy destination may use
  every process);
- with no worker ready (all restarting), it waits for one, at most
  ``READY_WAIT`` seconds.

An ``InvariantError`` in the worker's agent is raised again here (a bug stops
the daemon, as in process). It raises ``DeliveryWorkerError`` (the dispatcher's crash result: every
recipient deferred ``4.3.0``, logged, retried later) when the worker dies
with the request in flight, when the agent raised in the worker, when no
worker became ready, and when the worker gave no answer within ``bound``
seconds (a hung process: it is SIGKILLed, logged, and restarted like a dead
one, its other deliveries failing the same way). A delivery the worker had
done but not yet reported when it died is thus tried again: at least once,
as in Postfix. A cancelled ``deliver`` (shutdown) tells the worker to stop
that delivery (``k``).

``remote_agents(cfg, pool)`` is ``create_agents(cfg)`` with the agent of
every ``smtp``/``relay`` service replaced by a ``RemoteAgent`` on ``pool``
(the local ``discard``, ``error`` and ``retry`` agents stay in this process:
no I/O to move out); building the local agents first checks the settings
exactly as without workers (a bad value refuses the start or the reload
here, and the workers apply only what the queue manager accepted).
``RemoteAgent``'s ``bound`` for a request (``request_bound``) adds up the
transport's SMTP timeouts, one per phase plus ``smtp_data_xfer_timeout`` per
64 KiB of content, and doubles the sum: past that even a slow agent would
have given up on its own.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import signal
import sys
import zlib
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from qmgrd.config import Config
from qmgrd.daemon.dwire import LineWriter, decode_result, encode_request
from qmgrd.daemon.ipc import encode
from qmgrd.daemon.settings import delivery_services
from qmgrd.daemon.supervise import Child, Supervisor
from qmgrd.delivery.agent import Agent, DeliveryRequest, DeliveryResult
from qmgrd.delivery.settings import SmtpSettings
from qmgrd.errors import InvariantError
from qmgrd.spool import QueueFileContent

__all__ = [
    "DeliveryPool",
    "DeliveryWorkerError",
    "RemoteAgent",
    "delivery_worker_count",
    "remote_agents",
    "request_bound",
]

SPILL = 8  # deliveries in flight past the least busy worker's before a nexthop spills over
READY_WAIT = 60.0  # seconds a delivery waits for a worker when none is ready
_CHUNK = 65536
INTERNAL = "internal error:"  # an ``x`` text starting so: an InvariantError in the worker


class DeliveryWorkerError(Exception):
    """A delivery that a worker did not complete (the dispatcher's crash result)."""


def delivery_worker_count(cfg: Config) -> int:
    """``delivery_worker_processes`` (module doc)."""
    return cfg.get_int("delivery_worker_processes")


class DeliveryPool(Supervisor):
    """The delivery worker processes of one daemon (see the module doc)."""

    def __init__(self, config_dir: Path, count: int) -> None:
        """Prepare ``count`` workers (nothing runs before ``start``)."""
        super().__init__(count, what="delivery", program="delivery")
        self.config_dir = config_dir
        self._ids = itertools.count(1)
        self._pending: dict[Child, dict[int, asyncio.Future[list[Any]]]] = {}
        self._ready = asyncio.Event()
        self._lines: dict[Child, LineWriter] = {}  # requests, one write per loop turn

    def command(self, slot: int, channel: int) -> tuple[list[str], list[int]]:
        """``python -m qmgrd.daemon.delivery`` on the channel."""
        args = [
            sys.executable, "-m", "qmgrd.daemon.delivery", "-c", str(self.config_dir),
            "--channel", str(channel), "--parent", str(os.getpid()),
        ]  # fmt: skip
        return args, [channel]

    def on_ready(self, child: Child) -> None:
        """The worker takes deliveries."""
        self._pending.setdefault(child, {})
        self._ready.set()

    def on_exit(self, child: Child) -> None:
        """Fail the deliveries the worker had in flight."""
        self._lines.pop(child, None)
        pending = self._pending.pop(child, {})
        for future in pending.values():
            if not future.done():
                future.set_exception(
                    DeliveryWorkerError(f"delivery process pid {child.proc.pid} ended")
                )
        if not self._pending:
            self._ready.clear()

    def handle(self, child: Child, fields: list[Any]) -> None:
        """A result (``r``) or a failure (``x``) of a delivery in flight."""
        if fields[0] not in ("r", "x"):
            raise ValueError(f"unknown delivery message {fields[0]!r}")
        future = self._pending.get(child, {}).get(int(fields[1]))
        if future is not None and not future.done():
            future.set_result(fields)

    def inflight(self) -> dict[int, int]:
        """Deliveries in flight per worker pid (tests, status)."""
        return {c.proc.pid: len(p) for c, p in self._pending.items()}

    async def _choose(self, key: str) -> Child:
        """The worker for ``key`` (transport and nexthop), waiting for one if none is ready."""
        async with asyncio.timeout(READY_WAIT):
            while not self._pending:
                await self._ready.wait()
        children = sorted(self._pending, key=lambda c: c.slot)
        home = zlib.crc32(key.encode()) % self.count + 1
        least = min(children, key=lambda c: len(self._pending[c]))
        for child in children:
            if child.slot == home:
                if len(self._pending[child]) <= len(self._pending[least]) + SPILL:
                    return child
                return least
        return children[zlib.crc32(key.encode()) % len(children)]

    async def deliver(self, request: DeliveryRequest, bound: float) -> DeliveryResult:
        """The result of ``request`` from a worker (module doc)."""
        content = request.content
        if not isinstance(content, QueueFileContent):
            raise InvariantError(f"{request.queue_id}: a delivery worker needs a queue file")
        try:
            child = await self._choose(f"{request.transport}:{request.nexthop}")
        except TimeoutError:
            raise DeliveryWorkerError("no delivery process is running") from None
        n = next(self._ids)
        future: asyncio.Future[list[Any]] = asyncio.get_running_loop().create_future()
        pending = self._pending[child]
        pending[n] = future
        lines = self._lines.get(child)
        if lines is None:
            lines = self._lines[child] = LineWriter(child.writer)
        lines.write(encode_request(n, request, content))
        try:
            async with asyncio.timeout(bound):
                fields = await future
        except TimeoutError:
            self.log.error(
                f"delivery process pid {child.proc.pid} gave no result in {bound:.0f}s: killed",
                queue_id=request.queue_id,
            )
            if child.proc.returncode is None:
                child.proc.send_signal(signal.SIGKILL)
            raise DeliveryWorkerError("the delivery process gave no result in time") from None
        except asyncio.CancelledError:
            lines.write(encode("k", n))  # after its request, whenever that is written
            raise
        finally:
            pending.pop(n, None)
        if fields[0] == "x":
            text = f"in the delivery process pid {child.proc.pid}: {fields[2]}"
            if str(fields[2]).startswith(INTERNAL):
                raise InvariantError(text)  # a bug, as an InvariantError of an agent in process
            raise DeliveryWorkerError(text)
        return decode_result(fields, request.recipients)


class RemoteAgent:
    """An ``Agent`` whose deliveries run in the pool's processes."""

    __slots__ = ("bound", "pool")

    def __init__(self, pool: DeliveryPool, bound: Callable[[DeliveryRequest], float]) -> None:
        """``bound(request)``: seconds before a silent worker counts as hung."""
        self.pool = pool
        self.bound = bound

    async def deliver(self, request: DeliveryRequest) -> DeliveryResult:
        """The worker's result (``DeliveryWorkerError``: the dispatcher's crash result)."""
        return await self.pool.deliver(request, self.bound(request))

    async def close(self) -> None:
        """Nothing: the workers close their own agents (the pool stops them)."""


def request_bound(settings: SmtpSettings, request: DeliveryRequest) -> float:
    """The most a working agent may take on ``request`` (module doc), in seconds."""
    s = settings
    phases = (
        s.dns_timeout + s.connect_timeout + s.helo_timeout + s.starttls_timeout
        + s.mail_timeout + s.rcpt_timeout + s.data_init_timeout + s.data_done_timeout
        + s.rset_timeout + s.quit_timeout
    )  # fmt: skip
    chunks = max(1, -(-request.content.size // _CHUNK))
    return 2 * (phases + s.data_xfer_timeout * chunks)


def remote_agents(
    cfg: Config, pool: DeliveryPool, create: Callable[[Config], dict[str, Agent]]
) -> dict[str, Agent]:
    """``create(cfg)`` with the smtp/relay agents replaced by ``RemoteAgent`` (module doc)."""
    agents = create(cfg)  # every setting checked as without workers; the smtp ones unused
    for name, command in delivery_services(cfg).items():
        if command in ("smtp", "relay"):
            settings = SmtpSettings.from_transport(cfg.transport(name))
            agents[name] = RemoteAgent(pool, partial(request_bound, settings))
    return agents
