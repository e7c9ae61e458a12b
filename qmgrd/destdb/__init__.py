"""The destination database ("destdb" of the MTA-scheduler seed): state a cluster shares.

Contract
--------
A :class:`DestinationState` backend answers one question before each delivery starts,
``admit(key, limits)``, and hears how it ended, ``release(lease, ok=...)``:

- ``Verdict.OK``: go ahead; the returned :class:`Lease` is held until ``release`` (the
  backend renews it while it is held; a node that dies stops renewing and its leases
  expire within ``lease_ttl``). ``count`` is the number of sessions to the destination
  the backend knew of at that moment, this one included (what a 421 is compared to).
  ``probe`` True: the destination was dead and this node is the one that probes it.
- ``Verdict.FULL``: ``limits.cap`` sessions are already running (cluster-wide);
- ``Verdict.RATE``: the destination's rate limit allows the next one in ``retry_after`` s;
- ``Verdict.WAIT``: another node is probing a revived destination; ask again later;
- ``Verdict.DEAD``: the destination was declared dead (``dsn``), for ``retry_after`` s more.

``release(lease, ok=..., feedback=True)``: with ``limits.window`` (a shared backend), the
outcome is Postfix's concurrency feedback on the destination's *cluster-wide window*: ``ok``
positive, otherwise negative; ``feedback=False`` (a crash, or a refusal the gate learns from)
leaves the window alone. The shared window starts at ``window.init`` (the node's
``initial_destination_concurrency``, once for the whole cluster, not once per node) and
bounds the leases with the cap, so before anything is learned the cluster opens as many
sessions as one Postfix node would.

``publish_dead(key, seconds, dsn)`` tells every node that a destination is dead for
``seconds``; ``publish_limit(key, limit)`` shares a learned concurrency limit (the cap
becomes ``min(limits.cap, limit)`` for ``LEARNED_TTL`` seconds, and the shared window
settles at it) and returns the limit it published (0: nothing shared). ``status()`` is the
backend's state for ``qmgrd status`` and metrics. No method raises for a backend failure:
the Redis backend falls back to :class:`qmgrd.destdb.local.LocalState` (see there).

Backends: ``local`` (one node: the core's own windows and dead destinations, plus the
rate limit kept in-process) and ``redis://`` / ``rediss://`` (:mod:`qmgrd.destdb.redis`).
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass
from typing import Any, Protocol

from qmgrd.config.values import parse_time
from qmgrd.core.feedback import Feedback

__all__ = [
    "LEARNED_TTL",
    "Admission",
    "DestKey",
    "DestinationState",
    "Lease",
    "Limits",
    "Rate",
    "Verdict",
    "Window",
    "parse_rate",
]

LEARNED_TTL = 300.0
"""Seconds a published learned limit holds before the cap goes back to the configured one."""


class Verdict(enum.Enum):
    """What ``admit`` decided (module doc)."""

    OK = "ok"
    FULL = "full"
    RATE = "rate"
    WAIT = "wait"
    DEAD = "dead"


@dataclass(frozen=True, slots=True)
class DestKey:
    """One destination: a master.cf transport and the core's destination (queue) name."""

    transport: str
    name: str


@dataclass(frozen=True, slots=True)
class Rate:
    """``count`` deliveries per ``period`` seconds (GCRA: one every period/count, with up to
    ``burst`` back to back; any span of T seconds holds at most ``burst - 1 + T * count /
    period`` rounded up)."""

    count: int
    period: float
    burst: int = 1

    def __post_init__(self) -> None:
        if self.count <= 0 or self.period <= 0:
            raise ValueError(f"rate {self.count}/{self.period}s: both must be > 0")
        if self.burst < 1:
            raise ValueError(f"rate {self.count}/{self.period}s: max_burst must be >= 1")

    @property
    def interval(self) -> float:
        """Seconds between two deliveries."""
        return self.period / self.count


_RATE_RE = re.compile(r"^\s*(\d+)\s*/\s*([^\s,]+)\s*(?:,\s*max_burst\s*=\s*(\d+)\s*)?$")


def parse_rate(text: str) -> Rate | None:
    """``N/period[,max_burst=B]`` (``600/1m``, ``10/s``, ``600/1m,max_burst=30``: KumoMTA's
    throttle spelling) -> Rate; empty or ``0`` -> None.

    Raises ValueError naming the value for anything else.
    """
    text = text.strip()
    if text in ("", "0"):
        return None
    match = _RATE_RE.match(text)
    if match is None:
        raise ValueError(f"bad rate {text!r}: expected N/period, e.g. 600/1m")
    period_text = match.group(2)
    if period_text[0].isalpha():
        period_text = "1" + period_text  # "10/s" = 10 per 1s
    try:
        period = parse_time(period_text, "s")
    except ValueError:
        period = 0
    if period <= 0:
        raise ValueError(f"bad rate {text!r}: the period must be a time > 0 (1m, 30s)")
    count = int(match.group(1))
    if count == 0:
        return None
    burst = int(match.group(3)) if match.group(3) is not None else 1
    if burst < 1:
        raise ValueError(f"bad rate {text!r}: max_burst must be >= 1")
    return Rate(count, float(period), burst)


@dataclass(frozen=True, slots=True)
class Window:
    """Postfix's concurrency window settings for a shared window (module doc): the initial
    window and the positive and negative feedback (``qmgrd.core.feedback``)."""

    init: int
    positive: Feedback
    negative: Feedback


@dataclass(frozen=True, slots=True)
class Limits:
    """What a destination allows: ``cap`` concurrent sessions (0 = none), ``rate``, and the
    settings of its shared window (None: no shared window)."""

    cap: int = 0
    rate: Rate | None = None
    window: Window | None = None


@dataclass(slots=True, eq=False)
class Lease:
    """A granted admission, held until released (``shared``: held in Redis)."""

    key: DestKey
    ident: str
    shared: bool
    probe: bool = False
    count: int = 0  # sessions to the destination when it was granted, this one included
    limits: Limits | None = None  # what it was granted under (the window's feedback)
    granted: int = 0  # the shared backend's clock when it was granted (ms)


@dataclass(frozen=True, slots=True)
class Admission:
    """The answer of ``admit`` (module doc)."""

    verdict: Verdict
    retry_after: float = 0.0
    lease: Lease | None = None
    count: int = 0
    dsn: tuple[str, str] | None = None


class DestinationState(Protocol):
    """A destination-state backend (module doc)."""

    @property
    def shared(self) -> bool:
        """True for a backend other nodes see (leases, verdicts and limits are cluster-wide)."""
        ...

    async def admit(self, key: DestKey, limits: Limits) -> Admission:
        """May a delivery to ``key`` start now?"""
        ...

    async def release(self, lease: Lease, *, ok: bool, feedback: bool = True) -> None:
        """The delivery holding ``lease`` ended (``ok``: no destination failure; ``feedback``:
        the outcome counts for the shared window)."""
        ...

    async def publish_dead(self, key: DestKey, seconds: float, dsn: tuple[str, str]) -> None:
        """This node declared ``key`` dead for ``seconds``."""
        ...

    async def publish_limit(self, key: DestKey, limit: int, *, init: int = 0) -> int:
        """This node learned that ``key`` admits ``limit`` sessions (``init``: the initial
        window of a shared window, 0 = none); the limit shared (0: none)."""
        ...

    def status(self) -> dict[str, Any]:
        """Backend, connection state and counters (``qmgrd status``, metrics)."""
        ...

    async def close(self) -> None:
        """Release what is held and disconnect."""
        ...
