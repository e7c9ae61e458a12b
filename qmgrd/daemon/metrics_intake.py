"""Intake metrics: what the SMTP listener accepted and refused, through a small observer.

Contract
--------
The listener knows nothing of Prometheus: it calls an :class:`IntakeObserver`
(``ListenerContext.observer``; :data:`NULL_INTAKE` when none is given) at a
few points, each a one-line call that never raises and never blocks:

=======================  =====================================================
call                     when
=======================  =====================================================
``connected()``          a TCP connection was accepted (before any limit)
``rejected(reason)``     a connection refused at accept (``limits``)
``session_started()``    a session begins (after the admission checks)
``session_ended()``      that session ends, however it ends
``replied(text)``        every 4xx/5xx reply line the session sends; final
                         lines are counted as rejects by class (below)
``message_accepted(n)``  a message with ``n`` recipients was queued (250)
``auth_failed(mech)``    an AUTH exchange failed (535 or the 421 after it)
=======================  =====================================================

:class:`IntakeMetrics` implements it with Prometheus series in the daemon's
private registry: ``qmgrd_smtpd_connections_total``, ``qmgrd_smtpd_sessions``
(gauge), ``qmgrd_smtpd_messages_total``, ``qmgrd_smtpd_recipients_total``,
``qmgrd_smtpd_rejects_total{reason}`` and
``qmgrd_smtpd_auth_failures_total{mechanism}``.

Reject reasons (:func:`reject_reason`, from the reply, so every refusal the
listener can send is classified in one place): ``relay_denied`` (554 5.7.1
Relay access denied), ``size`` (552 / 5.3.4), ``too_many_recipients``
(4.5.3), ``storage`` (4.3.x: queue file write errors, insufficient storage),
``syntax`` (500-504, 553, 555: bad commands, addresses, sequence),
``limits`` (421 and 450 4.7.x: session, connection, error, junk-command and
AUTH limits, timeouts) and ``other``. AUTH's own 535 is not a reject (it is
``auth_failures_total``). Labels are never empty: an unknown mechanism is
``other``.

:class:`WorkerLoad` (``IntakeMetrics.workers``) exports each listener worker
process's state as its ``load`` and ``s`` messages report it
(``qmgrd.daemon.ipc``), labelled ``worker`` (its slot, 1..N, kept when a
worker is restarted): ``qmgrd_smtpd_worker_session_cap`` (its learned session
cap, ``docs/regulator.md``), ``qmgrd_smtpd_worker_sessions`` and
``qmgrd_smtpd_worker_event_loop_lag_seconds`` (a histogram with the buckets
of the queue manager's ``qmgrd_event_loop_lag_seconds``). A worker that died
has no gauges until its successor reports; its histogram stays (counts).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

from qmgrd.daemon.looplag import LAG_BUCKETS
from qmgrd.listener.observer import NULL_INTAKE, IntakeObserver

__all__ = [
    "AUTH_MECHANISMS",
    "NULL_INTAKE",
    "REJECT_REASONS",
    "IntakeMetrics",
    "IntakeObserver",
    "WorkerLoad",
    "reject_reason",
]

REJECT_REASONS = (
    "relay_denied", "size", "too_many_recipients", "storage", "syntax", "limits", "other",
)  # fmt: skip
AUTH_MECHANISMS = ("PLAIN", "LOGIN", "CRAM-MD5")

_SYNTAX_CODES = frozenset({"500", "501", "502", "503", "504", "553", "555"})
_ENHANCED = re.compile(r"[245]\.\d{1,3}\.\d{1,3}")


def reject_reason(text: str) -> str | None:
    """The reject class of a reply line; None for a reply that is not a reject (module doc)."""
    if len(text) < 3 or text[0] not in "45" or text[3:4] == "-":
        return None  # a success, an intermediate reply, or not the last line of a reply
    code = text[:3]
    if code == "535":
        return None  # counted as an AUTH failure, with its mechanism
    match = _ENHANCED.search(text[4:16])
    enhanced = match.group(0) if match else ""
    if "Relay access denied" in text:
        return "relay_denied"
    if code == "552" or enhanced == "5.3.4":
        return "size"
    if enhanced == "4.5.3":
        return "too_many_recipients"
    if enhanced.startswith("4.3.") and code in ("451", "452"):
        return "storage"
    if code in _SYNTAX_CODES:
        return "syntax"
    if code == "421" or (code == "450" and enhanced.startswith("4.7.")):
        return "limits"
    return "other"


class IntakeMetrics:
    """The Prometheus side of :class:`IntakeObserver` (series in the module doc)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        """Register the intake series in ``registry`` (the daemon's private one)."""
        self.connections = Counter(
            "qmgrd_smtpd_connections",
            "SMTP connections accepted by the listener (refused ones included).",
            registry=registry,
        )
        self.sessions = Gauge(
            "qmgrd_smtpd_sessions", "SMTP sessions in progress.", registry=registry
        )
        self.messages = Counter(
            "qmgrd_smtpd_messages",
            "Messages received and queued (250 after DATA).",
            registry=registry,
        )
        self.recipients = Counter(
            "qmgrd_smtpd_recipients",
            "Recipients of the messages received and queued.",
            registry=registry,
        )
        self.rejects = Counter(
            "qmgrd_smtpd_rejects",
            "SMTP replies refusing a client, by reason (relay_denied, size, "
            "too_many_recipients, storage, syntax, limits, other).",
            ("reason",),
            registry=registry,
        )
        self.auth_failures = Counter(
            "qmgrd_smtpd_auth_failures",
            "Failed SMTP AUTH exchanges by mechanism.",
            ("mechanism",),
            registry=registry,
        )
        self.workers = WorkerLoad()  # listener worker processes, per worker
        registry.register(self.workers)
        for reason in REJECT_REASONS:  # every series exists from the start (rate() needs it)
            self.rejects.labels(reason)
        for mechanism in AUTH_MECHANISMS:
            self.auth_failures.labels(mechanism)

    def connected(self) -> None:
        """A connection was accepted."""
        self.connections.inc()

    def rejected(self, reason: str) -> None:
        """A connection was refused before its session."""
        self.rejects.labels(reason if reason in REJECT_REASONS else "other").inc()

    def session_started(self) -> None:
        """A session began."""
        self.sessions.inc()

    def session_ended(self) -> None:
        """A session ended."""
        self.sessions.dec()

    def replied(self, text: str) -> None:
        """Count the reply line if it refuses something."""
        reason = reject_reason(text)
        if reason is not None:
            self.rejects.labels(reason).inc()

    def message_accepted(self, recipients: int) -> None:
        """A message was queued."""
        self.messages.inc()
        self.recipients.inc(max(0, recipients))

    def auth_failed(self, mechanism: str) -> None:
        """An AUTH exchange failed."""
        name = mechanism.upper()
        self.auth_failures.labels(name if name in AUTH_MECHANISMS else "other").inc()


class WorkerLoad(Collector):
    """Each listener worker's session cap, sessions and loop lag (module doc)."""

    def __init__(self) -> None:
        self.caps: dict[int, int] = {}
        self.sessions: dict[int, int] = {}
        self._buckets: dict[int, list[int]] = {}
        self._sums: dict[int, float] = {}

    def load(self, slot: int, fields: list[Any]) -> None:
        """A ``["load", cap, [n, ...], sum]`` message of worker ``slot`` (ValueError if bad)."""
        if len(fields) != 4 or not isinstance(fields[1], int) or not isinstance(fields[2], list):
            raise ValueError(f"bad load message: {fields!r}")
        counts, added = fields[2], fields[3]
        width = len(LAG_BUCKETS) + 1
        if len(counts) != width or not all(isinstance(n, int) and n >= 0 for n in counts):
            raise ValueError(f"bad load message: {fields!r}")
        if not isinstance(added, int | float):
            raise ValueError(f"bad load message: {fields!r}")
        self.caps[slot] = fields[1]
        buckets = self._buckets.setdefault(slot, [0] * width)
        for i, n in enumerate(counts):
            buckets[i] += n
        self._sums[slot] = self._sums.get(slot, 0.0) + float(added)

    def collect(self) -> Iterator[GaugeMetricFamily | HistogramMetricFamily]:
        """The per-worker families (module doc)."""
        cap = GaugeMetricFamily(
            "qmgrd_smtpd_worker_session_cap",
            "A listener worker's session cap: learned from its event loop's lag "
            "(in_flow_lag_limit), at most smtpd_session_limit.",
            labels=("worker",),
        )
        for slot, value in sorted(self.caps.items()):
            cap.add_metric((str(slot),), value)
        sessions = GaugeMetricFamily(
            "qmgrd_smtpd_worker_sessions",
            "SMTP sessions in progress in a listener worker.",
            labels=("worker",),
        )
        for slot, value in sorted(self.sessions.items()):
            sessions.add_metric((str(slot),), value)
        lag = HistogramMetricFamily(
            "qmgrd_smtpd_worker_event_loop_lag_seconds",
            "How late a listener worker's event loop ran a callback that was due "
            "(sampled every 10 ms; up to every 100 ms while the worker has no session).",
            labels=("worker",),
        )
        bounds = [*(repr(float(b)) for b in LAG_BUCKETS), "+Inf"]  # "1.0", as Histogram's
        for slot, counts in sorted(self._buckets.items()):
            running, cumulative = 0, []
            for bound, n in zip(bounds, counts, strict=True):
                running += n
                cumulative.append((bound, running))
            lag.add_metric((str(slot),), cumulative, self._sums[slot])
        yield from (cap, sessions, lag)
