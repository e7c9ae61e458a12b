"""The destination gate: the shared destination database asked before each delivery starts.

Contract
--------
``GateSettings.from_config(cfg)`` reads the cluster parameters (``destination_state_*``)
and each delivery transport's ``<transport>_destination_rate_limit``,
``_destination_concurrency_limit`` and ``_destination_concurrency_learning``; a bad value
is a ``ConfigError`` naming the parameter. ``create_gate(settings, ctx)`` builds the backend
(``local`` or Redis, :mod:`qmgrd.destdb`) and the gate.

``DestGate.active`` is False for ``local`` with no rate limit: dispatch then skips the gate
(no cost). With Redis the limits asked for carry the transport's concurrency limit and its
window settings (``initial_destination_concurrency`` and the positive and negative
feedback): the cluster shares one window per destination, so before anything is learned
the nodes together open as many sessions as one Postfix node would, not one window each.
With ``local`` only the rate limit is asked for (the core's window is Postfix's). Dispatch
calls, for each selected entry:

- ``before(entry) -> Lease | None`` — the backend's admission (one at a time per
  destination on this node; for ``FULL_RETRY`` after a FULL answer, and until this node
  releases one of its own leases there, the destination is refused here without a round
  trip, so a cluster at its cap is not polled once per waiting entry). ``None``: the entry
  did not start and the core was told: cluster full or rate-limited or another node probing
  (``Scheduler.entry_postpone``: back to TODO, the destination waits until the retry time),
  or declared dead by another node (``Scheduler.destination_hold``: dead here too until the
  shared revival time; the entry and the destination's TODO entries are deferred).
- ``after(entry, lease, result, crashed) -> bool`` — releases the lease (a probe's outcome
  becomes the destination's shared health; otherwise the outcome is feedback on the shared
  window: none for a crash, nor, with learning, for a throttling refusal). A 421 "full"
  refusal while other sessions held leases cluster-wide is learned: the limit (those
  sessions) is published for every node (the shared window settles at it),
  and the entry goes back (the core's own ``entry_throttled`` first, as on one node; when
  the node alone had nothing else running, ``entry_postpone``). True: the entry is handled,
  dispatch records nothing.

``observe(event)``: a destination this node's feedback declared dead is published for
``minimal_backoff_time`` (verdicts that came from other nodes are not re-published).
``status()`` is the backend's state; ``close()`` disconnects. A backend never raises for a
Redis failure (it falls back to local limits), so the gate never loses or repeats mail: an
entry is either started, put back in core, or deferred by the core with a reason.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from qmgrd.config import Config
from qmgrd.core.entry import Entry
from qmgrd.core.events import DestinationDead
from qmgrd.core.feedback import parse_feedback
from qmgrd.daemon.context import EngineContext
from qmgrd.delivery.agent import DeliveryResult
from qmgrd.destdb import (
    Admission,
    DestinationState,
    DestKey,
    Lease,
    Limits,
    Rate,
    Verdict,
    Window,
    parse_rate,
)
from qmgrd.destdb.local import LocalState
from qmgrd.destdb.redisstate import RedisState
from qmgrd.errors import ConfigError

__all__ = ["FULL_RETRY", "WAIT_RETRY", "DestGate", "GateSettings", "create_gate"]

FULL_RETRY = 0.1
"""Seconds a destination waits after the cluster cap refused a lease (no event tells when
another node's session ends)."""
WAIT_RETRY = 0.5
"""At most this many seconds between two looks while another node probes a destination."""
_FULL_KEPT = 10_000  # destinations remembered as FULL at once


@dataclass(frozen=True, slots=True)
class GateSettings:
    """The cluster parameters, read once (module doc)."""

    backend: str
    password: str
    timeout: float
    lease_ttl: float
    fallback_share: float
    dead_seconds: float
    rates: Mapping[str, Rate | None]
    caps: Mapping[str, int]
    learning: Mapping[str, bool]
    windows: Mapping[str, Window]

    @classmethod
    def from_config(cls, cfg: Config, transports: tuple[str, ...]) -> GateSettings:
        """Read and check the parameters; ``transports``: the delivery services."""
        backend = cfg.get_str("destination_state_backend").strip()
        if backend != "local" and not backend.startswith(("redis://", "rediss://", "unix://")):
            raise ConfigError(
                f"destination_state_backend: expected local, redis://host:port/db, "
                f"rediss://host:port/db or unix:///path?db=N, got {backend!r}"
            )
        rates: dict[str, Rate | None] = {}
        for name in transports:
            view = cfg.transport(name)
            try:
                rates[name] = parse_rate(view.get_str("destination_rate_limit"))
            except ValueError as exc:
                raise ConfigError(f"{name}_destination_rate_limit: {exc}") from None
        return cls(
            backend=backend,
            password=cfg.get_str("destination_state_password"),
            timeout=float(cfg.get_time("destination_state_timeout")),
            lease_ttl=float(cfg.get_time("destination_state_lease_ttl")),
            fallback_share=cfg.get_int("destination_state_fallback_percent") / 100.0,
            dead_seconds=float(cfg.get_time("minimal_backoff_time")),
            rates=rates,
            caps={n: cfg.transport(n).get_int("destination_concurrency_limit") for n in transports},
            learning={
                n: cfg.transport(n).get_bool("destination_concurrency_learning")
                for n in transports
            },
            windows={n: _window(cfg, n) for n in transports},
        )


def _window(cfg: Config, transport: str) -> Window:
    """A transport's window settings (a bad feedback value is warned about by the core's
    settings, and counts as constant 1 there and here)."""
    view = cfg.transport(transport)
    return Window(
        init=view.get_int("initial_destination_concurrency"),
        positive=parse_feedback(view.get_str("destination_concurrency_positive_feedback"))[0],
        negative=parse_feedback(view.get_str("destination_concurrency_negative_feedback"))[0],
    )


def create_state(settings: GateSettings, log: Any) -> DestinationState:
    """The backend the settings name."""
    if settings.backend == "local":
        return LocalState(time.monotonic)
    state = RedisState(
        settings.backend,
        fallback=LocalState(time.monotonic, share=settings.fallback_share),
        timeout=settings.timeout,
        lease_ttl=settings.lease_ttl,
        password=settings.password or None,
        log=log,
    )
    state.dead_seconds = settings.dead_seconds
    return state


class DestGate:
    """Admission before a delivery, release after it (module doc)."""

    def __init__(self, settings: GateSettings, state: DestinationState, ctx: EngineContext) -> None:
        """``state``: the backend; ``ctx``: the engine's (scheduler, clock, spawn, kick, log)."""
        self.state = state
        self.ctx = ctx
        self.settings = settings
        self.active = False
        self.update(settings)
        self.postponed = 0
        self.held = 0
        self.learned = 0
        self._full_until: dict[DestKey, float] = {}  # FULL lately: refused here until then
        self._turns: dict[DestKey, asyncio.Lock] = {}  # one admission at a time per destination
        self._waiting: dict[DestKey, int] = {}

    def update(self, settings: GateSettings) -> None:
        """Reloaded limits (the backend itself changes only with a restart)."""
        self.settings = settings
        shared = isinstance(self.state, RedisState)
        self.active = shared or any(r is not None for r in settings.rates.values())
        if isinstance(self.state, RedisState):
            self.state.dead_seconds = settings.dead_seconds

    def _limits(self, transport: str) -> Limits:
        rate = self.settings.rates.get(transport)
        if not isinstance(self.state, RedisState):
            return Limits(0, rate)
        settings = self.settings
        return Limits(settings.caps.get(transport, 0), rate, settings.windows.get(transport))

    async def before(self, entry: Entry) -> Lease | None:
        """Ask the backend; on a refusal tell the core and return None (module doc)."""
        key = DestKey(entry.transport, entry.queue.name)
        turn = self._turns.get(key)
        if turn is None:
            turn = self._turns[key] = asyncio.Lock()
        self._waiting[key] = self._waiting.get(key, 0) + 1
        try:
            async with turn:
                if self._full(key):
                    adm = Admission(Verdict.FULL)
                else:
                    adm = await self.state.admit(key, self._limits(entry.transport))
                    if adm.verdict is Verdict.FULL:
                        if len(self._full_until) >= _FULL_KEPT:
                            self._full_until.clear()  # bounded; at worst one more round trip
                        self._full_until[key] = self.ctx.clock.now() + FULL_RETRY
        finally:
            self._waiting[key] -= 1
            if not self._waiting[key]:
                del self._waiting[key], self._turns[key]
        if adm.lease is not None:
            adm.lease.count = adm.count
            return adm.lease
        self._refused(entry, adm)
        return None

    def _full(self, key: DestKey) -> bool:
        """The backend answered FULL for ``key`` less than FULL_RETRY ago (and this node has
        released nothing there since)."""
        until = self._full_until.get(key)
        if until is None:
            return False
        if until > self.ctx.clock.now():
            return True
        del self._full_until[key]
        return False

    def _refused(self, entry: Entry, adm: Admission) -> None:
        ctx = self.ctx
        now = ctx.clock.now()
        if adm.verdict is Verdict.DEAD:
            assert adm.dsn is not None
            self.held += 1
            ctx.scheduler.destination_hold(entry, dsn=adm.dsn, until=now + adm.retry_after, now=now)
        else:
            wait = {
                Verdict.FULL: FULL_RETRY,
                Verdict.RATE: adm.retry_after,
                Verdict.WAIT: min(WAIT_RETRY, adm.retry_after),
            }[adm.verdict]
            self.postponed += 1
            ctx.scheduler.entry_postpone(entry, until=now + max(0.001, wait), now=now)
        ctx.kick()

    async def after(
        self, entry: Entry, lease: Lease, result: DeliveryResult, crashed: bool
    ) -> bool:
        """Release the lease; True when a cluster-full refusal put the entry back."""
        hop = result.hop
        learning = self.settings.learning.get(entry.transport, False)
        await self.state.release(
            lease,
            ok=not crashed and hop is None,
            feedback=not crashed and not (learning and result.throttle is not None),
        )
        self._full_until.pop(lease.key, None)  # a session of ours ended: a slot may be free
        if (
            crashed
            or hop is None
            or result.throttle != "full"
            or not lease.shared
            or lease.count <= 1
            or not learning
        ):
            return False
        # The destination refused a session while others ran cluster-wide: their number is
        # its limit, for every node (the backend counts the leases held now).
        ctx = self.ctx
        self.learned += 1
        window = lease.limits.window if lease.limits is not None else None
        observed = await self.state.publish_limit(
            lease.key, lease.count - 1, init=window.init if window is not None else 0
        ) or lease.count - 1
        now = ctx.clock.now()
        if not ctx.scheduler.entry_throttled(
            entry, kind="full", hop=(hop.dsn, hop.reason), now=now
        ):
            ctx.scheduler.entry_postpone(entry, until=now + FULL_RETRY, now=now)
        ctx.log.info(
            "throttled",
            queue_id=entry.message.queue_id,
            transport=entry.transport,
            nexthop=entry.nexthop,
            kind="full",
            cluster_sessions=observed,
            reason=hop.reason,
        )
        ctx.kick()
        return True

    def observe(self, event: DestinationDead) -> None:
        """This node found ``event``'s destination dead: every node skips it until revival."""
        if event.shared or not self.state.shared:
            return
        key = DestKey(event.transport, event.queue_name)
        self.ctx.spawn(
            self.state.publish_dead(key, self.settings.dead_seconds, (event.status, event.reason))
        )

    def status(self) -> dict[str, Any]:
        """The backend's state and the gate's counters."""
        return {
            **self.state.status(),
            "postponed": self.postponed,
            "held_dead": self.held,
            "learned": self.learned,
        }

    async def close(self) -> None:
        """Disconnect the backend."""
        await self.state.close()


def create_gate(cfg: Config, ctx: EngineContext, transports: tuple[str, ...]) -> DestGate:
    """The gate for ``cfg`` on this engine's context (ConfigError for bad parameters)."""
    settings = GateSettings.from_config(cfg, transports)
    return DestGate(settings, create_state(settings, ctx.log), ctx)
