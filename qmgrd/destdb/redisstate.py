"""The Redis destination-state backend: leases, verdicts and rates shared by a cluster.

Contract
--------
``RedisState(url, fallback=LocalState(...), timeout=..., lease_ttl=..., password=None)``
implements :class:`qmgrd.destdb.DestinationState` on one Redis server (``redis://host:port/db``,
``rediss://`` for TLS; redis-py's URL options such as ``?ssl_ca_certs=`` apply). Every call is
one round trip, atomic on the server (a Lua script, as KumoMTA's Redis throttles and
connection leases are), and bounded by ``timeout``:

- ``admit``: the destination's health (dead until a time; after that one node, the prober,
  goes first and the others WAIT), then the concurrency cap (a sorted set of leases scored
  by expiry: expired ones are dropped first, so a crashed node's leases count for at most
  ``lease_ttl``), then the rate (GCRA: one TAT per destination, ``max_burst`` back to
  back), then the lease is added. The cap is ``min(limits.cap, published learned limit,
  shared window)``; the shared window (with ``limits.window``) starts at the initial window.
- ``release``: the lease is removed; a probe that succeeded clears the dead verdict (every
  node sees the revival, and the shared window starts again at the initial window), a
  failed one declares the destination dead again for ``dead_seconds`` (the node's
  ``minimal_backoff_time``). Otherwise the outcome is Postfix's feedback on the shared
  window (positive: it grows by the positive feedback while below the cap and below the
  sessions running plus the initial window, counting only sessions granted since its last
  change among as many sessions as the window; negative: it shrinks, never below 1).
- ``publish_limit``: the learned limit, for ``LEARNED_TTL``; the shared window settles at it.
  An idle destination's window is forgotten after ``LEARNED_TTL``.
- a background task renews every held lease each ``lease_ttl / 3`` (one round trip per
  destination, pipelined).

Times are the Redis server's clock (``TIME`` in the scripts): nodes' clocks never meet.

Redis failures never stop mail: any error or timeout switches the backend to ``fallback``
(this node's ``share`` of each cap and rate, counting the leases it still holds in Redis;
the cap is the one Redis last had in force for the destination, learned limit and shared
window included), logs it once, and a task pings every ``RECONNECT_DELAY`` seconds until
Redis answers again; then the node re-joins (logged), first putting a lease in Redis for
every session it still runs (those started on the fallback, and those whose leases a
restarted Redis lost), so the cap holds across the restart. Other nodes may still run
sessions on local limits that Redis does not count until they re-join too (within
``RECONNECT_DELAY + timeout``, or a renewal later, ``lease_ttl / 3``, for a node that
noticed nothing): for that long a re-joined node also keeps to its share. Leases released
during the outage expire within the TTL. Nothing here touches the spool: a Redis failure can
delay a delivery, never lose or repeat one.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import secrets
import socket
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import RedisError

from qmgrd.destdb import LEARNED_TTL, Admission, DestKey, Lease, Limits, Verdict
from qmgrd.destdb.local import LocalState
from qmgrd.destdb.scripts import ADMIT, ADOPT, DEAD, LIMIT, RELEASE, RENEW

__all__ = ["RECONNECT_DELAY", "RedisState", "describe_url"]

RECONNECT_DELAY = 1.0
"""Seconds between two reconnection attempts while Redis is unreachable."""

_WINDOW_TTL_MS = int(LEARNED_TTL * 1000)  # an idle destination's shared window is forgotten
_CAPS_KEPT = 10_000  # destinations whose last cap in force is remembered for the fallback

def describe_url(url: str) -> str:
    """``scheme://host:port/db`` (``unix:///path``) without the password or options (for logs
    and status)."""
    parts = urlsplit(url)
    if parts.scheme == "unix":
        return f"unix://{parts.path}"
    host = parts.hostname or "localhost"
    port = f":{parts.port}" if parts.port else ""
    return f"{parts.scheme}://{host}{port}{parts.path}"


def _keys(key: DestKey) -> list[str]:
    tag = f"qmgrd:{{{key.transport}|{key.name}}}"  # one hash slot per destination (Cluster)
    return [f"{tag}:leases", f"{tag}:health", f"{tag}:rate", f"{tag}:limit", f"{tag}:window"]


class RedisState:
    """Destination state on Redis with a local fallback (module doc)."""

    def __init__(
        self,
        url: str,
        *,
        fallback: LocalState,
        timeout: float,
        lease_ttl: float,
        password: str | None = None,
        log: Any = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """Build the client (it connects on first use: start-up never waits for Redis)."""
        self.url = describe_url(url)
        self.fallback = fallback
        self.timeout = timeout
        self.lease_ttl = lease_ttl
        self.log = log
        self._clock = clock
        self._client = aioredis.Redis.from_url(
            url,
            password=password or None,
            socket_timeout=timeout,
            socket_connect_timeout=timeout,
            retry=Retry(NoBackoff(), 0),
            decode_responses=True,
        )
        self._admit = self._client.register_script(ADMIT)
        self._release = self._client.register_script(RELEASE)
        self._dead = self._client.register_script(DEAD)
        self._renew = self._client.register_script(RENEW)
        self._adopt = self._client.register_script(ADOPT)
        self._limit = self._client.register_script(LIMIT)
        self._caps: dict[DestKey, int] = {}  # the cap in force at the last admission
        self._grace_until = 0.0  # after re-joining: this node's share holds too until then
        self._stand_ins: dict[DestKey, list[str]] = {}  # Redis leases for fallback sessions
        self.node = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"
        self._ids = itertools.count(1)
        self._held: dict[DestKey, set[str]] = {}
        self.up = True
        self.down_since: float | None = None
        self.outages = 0
        self.round_trips = 0
        self.errors = 0
        self._tasks: set[asyncio.Task[None]] = set()
        self._renewer: asyncio.Task[None] | None = None
        self._reconnector: asyncio.Task[None] | None = None
        self.dead_seconds = 0.0  # set by the gate: minimal_backoff_time

    @property
    def shared(self) -> bool:
        """True while Redis answers (False: on the local fallback)."""
        return self.up

    # ------------------------------------------------------------------ calls

    async def _call(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        """One round trip, bounded by ``timeout``; an error switches to the fallback."""
        self.round_trips += 1
        try:
            async with asyncio.timeout(self.timeout):
                return await fn(*args, **kwargs)
        except (RedisError, OSError, TimeoutError) as exc:
            self._went_down(exc)
            return None

    async def admit(self, key: DestKey, limits: Limits) -> Admission:
        """Health, cap, rate and lease in one atomic round trip (module doc)."""
        if not self.up:
            return self._fallback_admit(key, limits)
        if self._grace_until and not self._within_share(key, limits):
            return Admission(Verdict.FULL, count=len(self._held.get(key, ())))
        ident = f"{self.node}:{next(self._ids)}"
        rate, window = limits.rate, limits.window
        interval = rate.interval * 1000.0 if rate is not None else 0.0
        reply = await self._call(
            self._admit,
            keys=_keys(key),
            args=[
                ident, limits.cap, int(self.lease_ttl * 1000), f"{interval:.3f}", self.node,
                rate.burst if rate is not None else 1, window.init if window is not None else 0,
            ],
        )
        if reply is None:
            return self._fallback_admit(key, limits)
        verdict, number, count, status, reason, cap, server_now = reply
        number, count = int(number), int(count)
        if int(cap) > 0:
            if len(self._caps) >= _CAPS_KEPT and key not in self._caps:
                self._caps.clear()  # bounded: a destination not seen again is forgotten
            self._caps[key] = int(cap)
        if verdict == "ok":
            self._held.setdefault(key, set()).add(ident)
            self._ensure_renewer()
            lease = Lease(key, ident, shared=True, probe=number == 1, count=count, limits=limits)
            lease.granted = int(server_now)
            return Admission(Verdict.OK, lease=lease, count=count)
        if verdict == "dead":
            return Admission(Verdict.DEAD, retry_after=number / 1000.0, dsn=(status, reason))
        return Admission(Verdict(verdict), retry_after=number / 1000.0, count=count)

    def _known(self, limits: Limits, key: DestKey) -> Limits:
        """``limits`` with the cap Redis last had in force for ``key`` (learned limit, shared
        window), which this node's share is taken of while Redis cannot be asked."""
        known = self._caps.get(key, 0)
        if known and (limits.cap == 0 or known < limits.cap):
            return Limits(known, limits.rate, limits.window)
        return limits

    def _within_share(self, key: DestKey, limits: Limits) -> bool:
        """Just after re-joining, other nodes may still run sessions on local limits that Redis
        does not count: this node keeps to its share too until ``_grace_until``."""
        if self._clock() >= self._grace_until:
            self._grace_until = 0.0
            return True
        cap = self.fallback.local_cap(self._known(limits, key).cap)
        return cap == 0 or len(self._held.get(key, ())) < cap

    def _fallback_admit(self, key: DestKey, limits: Limits) -> Admission:
        # Sessions still running here on Redis leases count against this node's share.
        return self.fallback.admit_now(
            key, self._known(limits, key), elsewhere=len(self._held.get(key, ()))
        )

    async def release(self, lease: Lease, *, ok: bool, feedback: bool = True) -> None:
        """Remove the lease; a probe's outcome is the destination's new health; with a shared
        window, ``ok`` is positive feedback and a failure negative (``feedback`` False:
        neither)."""
        ident = lease.ident
        if not lease.shared:
            self.fallback.release_now(lease)
            stand_ins = self._stand_ins.get(lease.key)
            if not stand_ins:
                return
            ident = stand_ins.pop()  # the Redis lease that stood for it since re-joining
            if not stand_ins:
                del self._stand_ins[lease.key]
        held = self._held.get(lease.key)
        if held is not None:
            held.discard(ident)
            if not held:
                del self._held[lease.key]
        if not self.up:
            return  # it expires within lease_ttl
        limits = lease.limits or Limits()
        window = limits.window
        sign, step = "", None
        if feedback and window is not None:
            sign, step = ("p", window.positive) if ok else ("n", window.negative)
        keys = _keys(lease.key)
        await self._call(
            self._release,
            keys=[keys[0], keys[1], keys[3], keys[4]],
            args=[
                ident, int(lease.probe), int(ok), self.node, int(self.dead_seconds * 1000),
                window.init if window is not None else 0, limits.cap, sign,
                step.numerator if step else 0, step.kind if step else "",
                step.denominator if step else 1, _WINDOW_TTL_MS, lease.granted, lease.count,
            ],
        )

    async def _adopt_all(self) -> None:
        """Re-joining: put every session this node runs back in Redis (a restarted Redis has
        lost its leases; sessions started on the fallback never had one), so the cap holds."""
        for key, count in self.fallback.held_by_key().items():
            stand_ins = self._stand_ins.setdefault(key, [])
            while len(stand_ins) < count:
                ident = f"{self.node}:{next(self._ids)}"
                stand_ins.append(ident)
                self._held.setdefault(key, set()).add(ident)
        ttl_ms = int(self.lease_ttl * 1000)
        for key, ids in list(self._held.items()):
            await self._adopt(keys=[_keys(key)[0]], args=[ttl_ms, *sorted(ids)])
        if self._held:
            self._ensure_renewer()

    async def publish_dead(self, key: DestKey, seconds: float, dsn: tuple[str, str]) -> None:
        """Every node skips ``key`` for ``seconds`` from now (server time)."""
        if self.up:
            await self._call(
                self._dead, keys=[_keys(key)[1]], args=[int(seconds * 1000), dsn[0], dsn[1]]
            )

    async def publish_limit(self, key: DestKey, limit: int, *, init: int = 0) -> int:
        """A session to ``key`` was refused as one too many: the cluster cap is at most the
        sessions holding leases now (``limit``, those running when the refused one was
        granted, if none) for ``LEARNED_TTL`` seconds, never raised while it holds, and the
        shared window (``init``: the initial window; 0 = none) settles at it. Returns it."""
        if not self.up or limit <= 0:
            return 0
        keys = _keys(key)
        reply = await self._call(
            self._limit,
            keys=[keys[3], keys[4], keys[0]],
            args=[limit, int(LEARNED_TTL * 1000), init, _WINDOW_TTL_MS],
        )
        return 0 if reply is None else int(reply)

    # ------------------------------------------------------------------ background

    def _spawn(self, coro: Any) -> asyncio.Task[None]:
        task: asyncio.Task[None] = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def _ensure_renewer(self) -> None:
        if self._renewer is None or self._renewer.done():
            self._renewer = self._spawn(self._renew_loop())

    async def _renew_loop(self) -> None:
        """Every lease_ttl/3: push the expiry of every held lease (one pipelined round trip)."""
        ttl_ms = int(self.lease_ttl * 1000)
        while True:
            await asyncio.sleep(self.lease_ttl / 3.0)
            if not self.up or not self._held:
                continue
            held = [(key, sorted(ids)) for key, ids in self._held.items() if ids]

            async def renew_all(held: list[tuple[DestKey, list[str]]] = held) -> None:
                async with self._client.pipeline(transaction=False) as pipe:
                    for key, ids in held:
                        await self._renew(keys=[_keys(key)[0]], args=[ttl_ms, *ids], client=pipe)
                    await pipe.execute()

            await self._call(renew_all)

    def _went_down(self, exc: BaseException) -> None:
        self.errors += 1
        if not self.up:
            return
        self.up = False
        self.outages += 1
        self.down_since = self._clock()
        if self.log is not None:
            self.log.warning(
                "destination state unreachable: falling back to local limits",
                backend=self.url,
                share=self.fallback.share,
                error=repr(exc),
            )
        if self._reconnector is None or self._reconnector.done():
            self._reconnector = self._spawn(self._reconnect_loop())

    async def _reconnect_loop(self) -> None:
        """Ping every RECONNECT_DELAY until Redis answers, then re-join."""
        while not self.up:
            await asyncio.sleep(RECONNECT_DELAY)
            try:
                async with asyncio.timeout(self.timeout):
                    # Pooled connections to the old server are dead: drop them all, so the
                    # first calls after re-joining do not fail (and log a second outage).
                    await self._client.connection_pool.disconnect()
                    await self._client.ping()
                    await self._adopt_all()
            except (RedisError, OSError, TimeoutError):
                continue
            self.up = True
            # Until every node that noticed the outage has re-joined (its next ping, or its
            # next renewal for one that noticed nothing) some sessions are not in Redis.
            self._grace_until = (
                self._clock() + RECONNECT_DELAY + self.timeout + self.lease_ttl / 3.0
            )
            down = self._clock() - (self.down_since or self._clock())
            self.down_since = None
            if self.log is not None:
                self.log.info(
                    "destination state reachable again: re-joined the cluster",
                    backend=self.url,
                    outage_seconds=round(down, 3),
                )

    # ------------------------------------------------------------------ status, close

    def status(self) -> dict[str, Any]:
        """Backend, connection state and counters."""
        return {
            "backend": self.url,
            "connected": self.up,
            "fallback_seconds": (
                round(self._clock() - self.down_since, 3) if self.down_since is not None else 0
            ),
            "outages": self.outages,
            "errors": self.errors,
            "round_trips": self.round_trips,
            "leases": sum(len(ids) for ids in self._held.values()) + self.fallback.held(),
        }

    async def close(self) -> None:
        """Stop the background tasks and disconnect (held leases expire by themselves)."""
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        with contextlib.suppress(RedisError, OSError):
            await self._client.aclose()
