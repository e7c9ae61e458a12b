"""The ``local`` destination-state backend: one node's limits, kept in this process.

Contract
--------
``LocalState(clock, share=1.0)`` implements :class:`qmgrd.destdb.DestinationState` for one
node. It never answers DEAD or WAIT: with ``local`` each node finds dead destinations with
its own feedback, as Postfix does (the core's windows). It enforces:

- ``limits.rate`` with GCRA (:class:`qmgrd.core.gcra.Gcra`, the rate's ``max_burst``): a
  delivery may start when the destination's theoretical arrival time (TAT), less the burst's
  tolerance, has come; each one pushes the TAT by ``period / count``.
  With ``share`` < 1 the rate and the burst (at least 1) are ``share`` of it (the Redis
  backend's fallback: this node's share of a cluster-wide limit);
- ``limits.cap`` times ``share`` (at least 1) concurrent leases per destination: with
  ``share`` 1 that is the transport's concurrency limit, which the core's window already
  keeps, so only the fallback ever sees FULL. ``limits.window`` is ignored: with ``local``
  the core's own window is Postfix's per-node window.

``clock`` returns seconds (monotonic); tests pass a fake one. A destination's rate record is
dropped when its last lease is released after its TAT, or by a sweep once 10,000 are kept.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from typing import Any

from qmgrd.core.gcra import Gcra
from qmgrd.destdb import Admission, DestKey, Lease, Limits, Verdict

__all__ = ["LocalState"]

_SWEEP_AT = 10_000  # rate records kept before the idle ones are swept


class LocalState:
    """In-process destination state (module doc)."""

    def __init__(self, clock: Callable[[], float], *, share: float = 1.0) -> None:
        """``share`` in (0, 1]: the part of each cap and rate this node may use."""
        if not 0.0 < share <= 1.0:
            raise ValueError(f"share {share}: must be in (0, 1]")
        self._clock = clock
        self.share = share
        self._rates: dict[DestKey, Gcra] = {}
        self._leases: dict[DestKey, int] = {}
        self._ids = itertools.count(1)
        self.denied = 0

    @property
    def shared(self) -> bool:
        """Never: only this node sees it."""
        return False

    def local_cap(self, cap: int) -> int:
        """This node's part of ``cap`` (0 = no cap)."""
        return 0 if cap <= 0 else max(1, math.floor(cap * self.share))

    async def admit(self, key: DestKey, limits: Limits) -> Admission:
        """Cap, then rate; a lease is taken only when both allow (module doc)."""
        return self.admit_now(key, limits)

    def admit_now(self, key: DestKey, limits: Limits, *, elsewhere: int = 0) -> Admission:
        """``admit`` without awaiting; ``elsewhere``: sessions this node runs on leases held
        outside this object (the Redis backend's fallback counts its Redis leases)."""
        held = self._leases.get(key, 0) + elsewhere
        cap = self.local_cap(limits.cap)
        if cap and held >= cap:
            self.denied += 1
            return Admission(Verdict.FULL, count=held)
        if limits.rate is not None:
            now = self._clock()
            per_second = self.share / limits.rate.interval
            burst = max(1.0, math.floor(limits.rate.burst * self.share))
            gcra = self._rates.get(key)
            if gcra is None or gcra.rate != per_second or gcra.burst != burst:  # new, reloaded
                if len(self._rates) >= _SWEEP_AT:
                    self._sweep(now)
                gcra = self._rates[key] = Gcra(per_second, burst)
            if not gcra.conforms(now):
                self.denied += 1
                return Admission(Verdict.RATE, retry_after=gcra.allowed_at(now) - now, count=held)
            gcra.take(now)
        self._leases[key] = self._leases.get(key, 0) + 1
        return Admission(
            Verdict.OK, lease=Lease(key, f"local:{next(self._ids)}", shared=False), count=held + 1
        )

    def _sweep(self, now: float) -> None:
        """Forget the rate records that would allow a delivery now anyway."""
        for key in [k for k, g in self._rates.items() if g.conforms(now)]:
            del self._rates[key]

    async def release(self, lease: Lease, *, ok: bool, feedback: bool = True) -> None:
        """Give the lease back."""
        self.release_now(lease)

    def release_now(self, lease: Lease) -> None:
        """``release`` without awaiting."""
        held = self._leases.get(lease.key, 0) - 1
        if held > 0:
            self._leases[lease.key] = held
        else:
            self._leases.pop(lease.key, None)
            gcra = self._rates.get(lease.key)
            if gcra is not None and gcra.conforms(self._clock()):
                del self._rates[lease.key]  # idle: a new record would allow the same

    async def publish_dead(self, key: DestKey, seconds: float, dsn: tuple[str, str]) -> None:
        """Nothing to share: the core keeps this node's dead destinations."""

    async def publish_limit(self, key: DestKey, limit: int, *, init: int = 0) -> int:
        """Nothing to share: the core keeps this node's learned window."""
        return 0

    def held_by_key(self) -> dict[DestKey, int]:
        """Leases held now, per destination."""
        return dict(self._leases)

    def held(self) -> int:
        """Leases held now (all destinations)."""
        return sum(self._leases.values())

    def status(self) -> dict[str, Any]:
        """The backend's state for ``qmgrd status``."""
        return {"backend": "local", "leases": self.held(), "denied": self.denied}

    async def close(self) -> None:
        """Nothing to disconnect."""
