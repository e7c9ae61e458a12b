"""The ``local`` destination-state backend: one node's limits, kept in this process.

Contract
--------
``LocalState(clock, share=1.0)`` implements :class:`qmgrd.destdb.DestinationState` for one
node. It never answers DEAD or WAIT: with ``local`` each node finds dead destinations with
its own feedback, as Postfix does (the core's windows). It enforces:

- ``limits.rate`` with GCRA (burst 1): a delivery may start when the destination's
  theoretical arrival time (TAT) has come; each one pushes the TAT by ``period / count``.
  With ``share`` < 1 the rate is ``share`` of it (the Redis backend's fallback: this node's
  share of a cluster-wide limit);
- ``limits.cap`` times ``share`` (at least 1) concurrent leases per destination: with
  ``share`` 1 that is the transport's concurrency limit, which the core's window already
  keeps, so only the fallback ever sees FULL.

``clock`` returns seconds (monotonic); tests pass a fake one. Records of idle destinations
are dropped when their TAT has passed and no lease is held (bounded memory).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from typing import Any

from qmgrd.destdb import Admission, DestKey, Lease, Limits, Verdict

__all__ = ["LocalState", "gcra_admit"]


def gcra_admit(tat: float, now: float, interval: float) -> tuple[bool, float]:
    """GCRA with burst 1: (allowed, new TAT or seconds to wait).

    Allowed when ``tat <= now``; the new TAT is ``max(tat, now) + interval``. Denied: the
    second value is how long until it is allowed. The Redis script does the same in Lua.
    """
    if tat > now:
        return False, tat - now
    return True, max(tat, now) + interval


class LocalState:
    """In-process destination state (module doc)."""

    def __init__(self, clock: Callable[[], float], *, share: float = 1.0) -> None:
        """``share`` in (0, 1]: the part of each cap and rate this node may use."""
        if not 0.0 < share <= 1.0:
            raise ValueError(f"share {share}: must be in (0, 1]")
        self._clock = clock
        self.share = share
        self._tat: dict[DestKey, float] = {}
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
            ok, value = gcra_admit(self._tat.get(key, now), now, limits.rate.interval / self.share)
            if not ok:
                self.denied += 1
                return Admission(Verdict.RATE, retry_after=value, count=held)
            self._tat[key] = value
        self._leases[key] = self._leases.get(key, 0) + 1
        return Admission(
            Verdict.OK, lease=Lease(key, f"local:{next(self._ids)}", shared=False), count=held + 1
        )

    async def release(self, lease: Lease, *, ok: bool) -> None:
        """Give the lease back."""
        self.release_now(lease)

    def release_now(self, lease: Lease) -> None:
        """``release`` without awaiting."""
        held = self._leases.get(lease.key, 0) - 1
        if held > 0:
            self._leases[lease.key] = held
        else:
            self._leases.pop(lease.key, None)
            tat = self._tat.get(lease.key)
            if tat is not None and tat <= self._clock():
                del self._tat[lease.key]

    async def publish_dead(self, key: DestKey, seconds: float, dsn: tuple[str, str]) -> None:
        """Nothing to share: the core keeps this node's dead destinations."""

    async def publish_limit(self, key: DestKey, limit: int) -> None:
        """Nothing to share: the core keeps this node's learned window."""

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
