"""Per-client limits across listener worker processes: the queue manager as Postfix's anvil.

Contract
--------
With listener workers (``smtpd_worker_processes`` > 1) the per-client counts
of ``smtpd_client_connection_count_limit`` and ``smtpd_client_auth_rate_limit``
are kept once, in the queue manager, as Postfix keeps them in its one
``anvil`` server; each worker asks over its notify channel
(``qmgrd.daemon.ipc``):

=========================================  ============================================
worker -> queue manager                    queue manager -> worker
=========================================  ============================================
``["anvil", id, "connect", addr]``         ``["anvil", id, count]``: live sessions of
                                           ``addr`` over every worker, this one counted
``["anvil", 0, "disconnect", addr]``       (no answer)
``["anvil", id, "auth", addr, unit]``      ``["anvil", id, count]``: AUTH commands of
                                           ``addr`` in its window of ``unit`` seconds
=========================================  ============================================

:class:`Anvil` (queue manager) counts sessions per worker slot too, so when a
worker's channel ends (it died) ``lost(slot)`` forgets its sessions at once.
Keys are ``SERVICE:ADDR`` (``AnvilClient.service``): as Postfix's anvil, each
master.cf service counts its clients apart. The worker decides, as Postfix's
smtpd does with anvil's answer (``421 4.7.0
... too many connections``, ``450 4.7.1 ... too many AUTH commands``).

:class:`AnvilClient` (worker, a ``qmgrd.listener.limits.SharedCounts``)
waits at most ``ANVIL_WAIT`` seconds for an answer. **Fallback**: with no
answer in time it returns None and the listener compares its own process's
count instead (fail open: a client may then hold up to N x the limit over N
workers), logged once ("anvil: the queue manager did not answer ...", at
most one such line per ``LOG_INTERVAL``: a queue manager whose answers hover
around the wait does not flood the log); until an answer arrives again
(logged after a logged outage), requests are still sent (so the
queue manager's counts stay right) but not waited for, so a stalled queue
manager never delays a greeting by more than one ``ANVIL_WAIT``. Every
``connect`` sent is followed by its ``disconnect``, answered or not.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from qmgrd.daemon.ipc import encode
from qmgrd.listener.limits import ClientCounters
from qmgrd.log import get_logger

__all__ = ["ANVIL_WAIT", "Anvil", "AnvilClient", "ServiceCounts"]

ANVIL_WAIT = 1.0  # seconds a worker waits for the count (overload bench: control ping max 0.6 s)
LOG_INTERVAL = 60.0  # seconds: one "did not answer" line per outage, at most one a minute
_PENDING_MAX = 10000  # unanswered requests remembered at most (a stalled queue manager)


class Anvil:
    """The queue manager's per-client counts for every listener worker (module doc)."""

    __slots__ = ("_by_slot", "_clock", "counters")

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self.counters = ClientCounters()
        self._by_slot: dict[int, Counter[str]] = {}

    def connect(self, slot: int, addr: str) -> int:
        """Count a session of ``addr`` in worker ``slot``; its live sessions everywhere."""
        self._by_slot.setdefault(slot, Counter())[addr] += 1
        return self.counters.connect(addr)

    def disconnect(self, slot: int, addr: str) -> None:
        """A session of ``addr`` in worker ``slot`` ended (unknown ones are ignored)."""
        mine = self._by_slot.get(slot)
        if mine is None or mine[addr] < 1:
            return  # counted before a lost() of this slot: already forgotten
        mine[addr] -= 1
        if not mine[addr]:
            del mine[addr]
        self.counters.disconnect(addr)

    def auth(self, addr: str, unit: float) -> int:
        """Count an AUTH command of ``addr``; its count in the current window of ``unit``."""
        return self.counters.auth_event(addr, self._clock(), unit)

    def lost(self, slot: int) -> None:
        """Worker ``slot``'s channel ended: forget its sessions."""
        for addr, count in (self._by_slot.pop(slot, None) or {}).items():
            for _ in range(count):
                self.counters.disconnect(addr)

    def message(self, slot: int, fields: list[Any]) -> bytes | None:
        """Apply one ``anvil`` message of worker ``slot``; the answer to send, if any.

        ``ValueError`` for a malformed message (the caller logs it).
        """
        if len(fields) < 4 or not isinstance(fields[3], str):
            raise ValueError(f"bad anvil message: {fields!r}")
        request, op, addr = fields[1], fields[2], fields[3]
        if op == "disconnect":
            self.disconnect(slot, addr)
            return None
        if op == "connect":
            count = self.connect(slot, addr)
        elif op == "auth" and len(fields) == 5 and isinstance(fields[4], int | float):
            count = self.auth(addr, float(fields[4]))
        else:
            raise ValueError(f"bad anvil message: {fields!r}")
        return encode("anvil", request, count)


class AnvilClient:
    """A worker's side: asks the queue manager, bounded wait, fallback (module doc)."""

    __slots__ = (
        "_announced",
        "_clock",
        "_logged",
        "_next",
        "_pending",
        "_send",
        "degraded",
        "log",
        "wait",
    )

    def __init__(
        self,
        send: Callable[[bytes], None],
        *,
        wait: float = ANVIL_WAIT,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``send`` writes one encoded message to the channel."""
        self._send = send
        self.wait = wait
        self._clock = clock
        self._logged: float | None = None  # when the last "did not answer" line was logged
        self._announced = False  # this outage was logged: log its end too
        self._next = 0
        self._pending: dict[int, asyncio.Future[int]] = {}
        self.degraded = False  # the last request went unanswered: no waiting until one is
        self.log = get_logger("smtpd")

    async def connect(self, addr: str) -> int | None:
        """The live sessions of ``addr`` over every worker, this one counted; None: no answer."""
        return await self._ask("connect", addr)

    def disconnect(self, addr: str) -> None:
        """Report the end of a session counted with ``connect``."""
        self._send(encode("anvil", 0, "disconnect", addr))

    async def auth_event(self, addr: str, unit: float) -> int | None:
        """The AUTH commands of ``addr`` in its window over every worker; None: no answer."""
        return await self._ask("auth", addr, unit)

    async def _ask(self, op: str, *args: Any) -> int | None:
        self._next += 1
        request = self._next
        future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._pending[request] = future
        if len(self._pending) > _PENDING_MAX:
            self._pending.pop(next(iter(self._pending))).cancel()
        self._send(encode("anvil", request, op, *args))
        if self.degraded:
            return None  # answered later (or never); the answer ends the degraded state
        try:
            async with asyncio.timeout(self.wait):
                return await asyncio.shield(future)
        except TimeoutError:
            self.degraded = True
            now = self._clock()
            if self._logged is None or now - self._logged >= LOG_INTERVAL:
                self._logged, self._announced = now, True
                self.log.warning(
                    f"anvil: the queue manager did not answer within {self.wait:g}s; per-client "
                    "limits count this process's sessions only until it does"
                )
            return None

    def answer(self, fields: list[Any]) -> None:
        """A ``["anvil", id, count]`` from the queue manager (``ValueError`` if malformed)."""
        if len(fields) != 3 or not isinstance(fields[1], int) or not isinstance(fields[2], int):
            raise ValueError(f"bad anvil answer: {fields!r}")
        future = self._pending.pop(fields[1], None)
        if self.degraded:
            self.degraded = False
            if self._announced:
                self._announced = False
                self.log.info("anvil: the queue manager answers again")
        if future is not None and not future.done():
            future.set_result(fields[2])

    def service(self, name: str) -> ServiceCounts:
        """The counts of master.cf service ``name`` (Postfix's anvil keys are service+client)."""
        return ServiceCounts(self, name)

    def close(self) -> None:
        """Forget the requests still unanswered (the channel is gone)."""
        for future in self._pending.values():
            future.cancel()
        self._pending.clear()


class ServiceCounts:
    """One listener's view of an :class:`AnvilClient`: keys ``SERVICE:ADDR``, as anvil's."""

    __slots__ = ("_client", "_prefix")

    def __init__(self, client: AnvilClient, service: str) -> None:
        self._client = client
        self._prefix = service + ":"

    async def connect(self, addr: str) -> int | None:
        """``AnvilClient.connect`` for this service."""
        return await self._client.connect(self._prefix + addr)

    def disconnect(self, addr: str) -> None:
        """``AnvilClient.disconnect`` for this service."""
        self._client.disconnect(self._prefix + addr)

    async def auth_event(self, addr: str, unit: float) -> int | None:
        """``AnvilClient.auth_event`` for this service."""
        return await self._client.auth_event(self._prefix + addr, unit)
