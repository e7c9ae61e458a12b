"""Prometheus metrics: delivery counters and histograms, queue and scheduler gauges, an endpoint.

Two kinds of series (docs/operations.md lists every one and how to read it):

- **Events**, counted as they happen: the engine calls
  :meth:`Metrics.record_delivery` for the recipient outcomes of a delivery (one call per
  status and DSN code, ``count`` recipients) and
  :meth:`Metrics.record_attempt` once per delivery request handed to an
  agent. Counters and histograms live in a private ``CollectorRegistry``
  (never prometheus_client's global one: no module state, and several
  daemons can run in one test process).
- **State**, read at scrape time by a custom collector: ``status_fn()``
  returns the engine's typed snapshot (``Engine.snapshot()``,
  ``qmgrd.daemon.snapshot.EngineStatus``: uptime, messages and
  recipients in core, transports with their destination queues) and
  ``queue_counts_fn()`` the number of files per spool queue. Only the
  ``top_destinations`` busiest destinations get per-destination series, so
  a queue full of distinct domains cannot blow up the series count; totals
  per transport cover the rest.

- **Intake**, counted by the SMTP listener through the observer protocol
  :class:`IntakeObserver` (``qmgrd.daemon.metrics_intake``, re-exported
  here): ``Metrics.intake`` is the daemon's observer.
- **Age**: ``queue_ages_fn()`` (:func:`spool_oldest_ages`) gives, per spool
  queue, the age of its oldest message from the creation time in its queue
  id (no file is opened); an empty queue is 0. Read at scrape time off the
  loop, as ``qmgrd_queue_oldest_message_age_seconds{queue}``.
- ``qmgrd_build_info{version,python} 1``.
- **Flows** (fair queuing): per transport with fairness on, the top flows by backlog and
  ``other`` (``qmgrd.daemon.metrics_flows``).

Labels are never empty: a caller that passes an empty label value is a bug
(``InvariantError``).

Reason classes: a deferral or bounce is labelled by the class and subject of
its enhanced status code (RFC 3463), ``4.4.x`` for "4.4.1 connection
refused", so the label has at most 3 x 8 values plus ``other``.

The endpoint is a minimal HTTP/1.0 server on the daemon's own loop
(:func:`start_metrics_server`, in ``qmgrd.daemon.metrics_http`` and
re-exported here): ``GET /metrics`` (and HEAD), one request per connection.
Spool directory counting runs in a worker thread; the engine snapshot is
taken on the loop, where the engine's structures live.
"""

from __future__ import annotations

import asyncio
import platform
import re
from collections.abc import Callable, Iterable, Mapping

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import generate_latest
from prometheus_client.registry import Collector

from qmgrd import __version__
from qmgrd.daemon.metrics_cluster import destination_state_metrics
from qmgrd.daemon.metrics_flows import flow_metrics
from qmgrd.daemon.metrics_http import MetricsServer, start_metrics_server
from qmgrd.daemon.metrics_intake import NULL_INTAKE, IntakeMetrics, IntakeObserver
from qmgrd.daemon.metrics_spool import (
    AGE_QUEUES,
    SPOOL_QUEUES,
    spool_oldest_ages,
    spool_queue_counts,
)
from qmgrd.daemon.snapshot import DestinationStatus, EngineStatus
from qmgrd.errors import InvariantError

__all__ = [
    "AGE_QUEUES",
    "NULL_INTAKE",
    "SPOOL_QUEUES",
    "IntakeObserver",
    "Metrics",
    "MetricsServer",
    "reason_class",
    "spool_oldest_ages",
    "spool_queue_counts",
    "start_metrics_server",
]

StatusFn = Callable[[], EngineStatus]
QueueCountsFn = Callable[[], Mapping[str, int]]
QueueAgesFn = Callable[[], Mapping[str, float]]

STATUSES = ("sent", "deferred", "bounced", "expired")

# From "just delivered" to "expired after maximal_queue_lifetime (5d)".
DELAY_BUCKETS = (
    0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 1800, 3600, 4 * 3600, 86400, 5 * 86400,
)  # fmt: skip
# One agent call: a connection (DNS, TCP, TLS, EHLO) plus the transaction.
ATTEMPT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)

_DSN = re.compile(r"([245])\.(\d{1,3})\.\d{1,3}")
# (transport, status) pairs whose labelled series ``record_delivery`` keeps at hand (a label
# lookup costs more than the increment); past this many the memo starts over.
_CHILDREN_LIMIT = 1024


def reason_class(dsn: str) -> str:
    """``4.4.1`` -> ``4.4.x``; ``other`` for anything that is not an RFC 3463 code."""
    match = _DSN.fullmatch(dsn.strip())
    if match is None or int(match.group(2)) > 7:
        return "other"
    return f"{match.group(1)}.{int(match.group(2))}.x"




class Metrics:
    """The daemon's metrics: event counters the engine feeds, state read at scrape time."""

    def __init__(
        self,
        status_fn: StatusFn | None = None,
        queue_counts_fn: QueueCountsFn | None = None,
        *,
        queue_ages_fn: QueueAgesFn | None = None,
        top_destinations: int = 20,
    ) -> None:
        """``status_fn``/``queue_counts_fn`` may also be assigned later (when the engine exists)."""
        if top_destinations < 0:
            raise InvariantError(f"top_destinations must be >= 0, not {top_destinations}")
        self.status_fn = status_fn
        self.queue_counts_fn = queue_counts_fn
        self.queue_ages_fn = queue_ages_fn
        self.top_destinations = top_destinations
        self.registry = CollectorRegistry(auto_describe=False)
        self.deliveries = Counter(
            "qmgrd_deliveries",
            "Recipient delivery outcomes by transport and status (sent, deferred, bounced, "
            "expired).",
            ("transport", "status"),
            registry=self.registry,
        )
        self.deferrals = Counter(
            "qmgrd_deferrals",
            "Deferred recipients by transport and reason class (DSN class.subject, e.g. 4.4.x).",
            ("transport", "reason_class"),
            registry=self.registry,
        )
        self.bounces = Counter(
            "qmgrd_bounces",
            "Bounced recipients by transport and reason class (DSN class.subject, e.g. 5.1.x).",
            ("transport", "reason_class"),
            registry=self.registry,
        )
        self.delay = Histogram(
            "qmgrd_delivery_delay_seconds",
            "Time from message arrival to each recipient outcome, by transport and status.",
            ("transport", "status"),
            buckets=DELAY_BUCKETS,
            registry=self.registry,
        )
        self.attempt = Histogram(
            "qmgrd_delivery_attempt_seconds",
            "Duration of one delivery request to an agent (connection and transaction).",
            ("transport",),
            buckets=ATTEMPT_BUCKETS,
            registry=self.registry,
        )
        # (transport, status) -> the deliveries counter's and delay histogram's labelled series
        self._outcome_children: dict[tuple[str, str], tuple[Counter, Histogram]] = {}
        self._attempt_children: dict[str, Histogram] = {}  # transport -> its attempt series
        self.intake: IntakeObserver = IntakeMetrics(self.registry)
        self._state = _StateCollector(self)
        self.registry.register(self._state)

    # ------------------------------------------------------------------ events

    def record_delivery(
        self, transport: str, status: str, dsn: str, seconds: float, count: int = 1
    ) -> None:
        """``count`` recipient outcomes of one delivery (one status, one DSN code);
        ``seconds`` = arrival to outcome (the log's ``delay=``), observed once per recipient."""
        children = self._outcome_children.get((transport, status))
        if children is None:
            if status not in STATUSES:
                raise InvariantError(f"record_delivery: unknown status {status!r}")
            if not transport:
                raise InvariantError(f"record_delivery: empty transport label ({status})")
            if len(self._outcome_children) >= _CHILDREN_LIMIT:
                self._outcome_children.clear()
            children = (
                self.deliveries.labels(transport, status),
                self.delay.labels(transport, status),
            )
            self._outcome_children[(transport, status)] = children
        counter, delay = children
        counter.inc(count)
        if status == "deferred":
            self.deferrals.labels(transport, reason_class(dsn)).inc(count)
        elif status == "bounced":
            self.bounces.labels(transport, reason_class(dsn)).inc(count)
        value = max(seconds, 0.0)
        for _ in range(count):
            delay.observe(value)

    def record_attempt(self, transport: str, seconds: float) -> None:
        """One delivery request handed to an agent took ``seconds``."""
        child = self._attempt_children.get(transport)
        if child is None:
            if len(self._attempt_children) >= _CHILDREN_LIMIT:
                self._attempt_children.clear()
            child = self._attempt_children[transport] = self.attempt.labels(transport)
        child.observe(max(seconds, 0.0))

    # ------------------------------------------------------------------ exposition

    def generate(self) -> bytes:
        """The text exposition, synchronously (queue counts read here, on this thread)."""
        return generate_latest(self.registry)

    async def render(self) -> bytes:
        """The text exposition for a scrape: directory counting off the loop, the rest on it."""
        counts: Mapping[str, int] | None = None
        ages: Mapping[str, float] | None = None
        if self.queue_counts_fn is not None:
            counts = await asyncio.to_thread(self.queue_counts_fn)
        if self.queue_ages_fn is not None:
            ages = await asyncio.to_thread(self.queue_ages_fn)
        # No await from here on: the snapshot and the exposition belong together.
        self._state.counts, self._state.ages = counts, ages
        try:
            return generate_latest(self.registry)
        finally:
            self._state.counts = self._state.ages = None


class _StateCollector(Collector):
    """Reads the engine snapshot and the queue counts at scrape time."""

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics
        self.counts: Mapping[str, int] | None = None  # set by Metrics.render for one scrape
        self.ages: Mapping[str, float] | None = None  # likewise

    def describe(self) -> Iterable[Metric]:
        """Nothing to pre-declare: the series depend on the state at scrape time."""
        return ()

    def collect(self) -> Iterable[Metric]:
        """Gauges for the spool queues, the scheduler's transports and the busiest destinations."""
        metrics = self.metrics
        counts = self.counts
        if counts is None and metrics.queue_counts_fn is not None:
            counts = metrics.queue_counts_fn()
        if counts is not None:
            files = GaugeMetricFamily(
                "qmgrd_queue_messages", "Queue files per spool queue.", labels=("queue",)
            )
            for queue, count in sorted(counts.items()):
                files.add_metric((queue,), count)
            yield files
        ages = self.ages
        if ages is None and metrics.queue_ages_fn is not None:
            ages = metrics.queue_ages_fn()
        if ages is not None:
            oldest = GaugeMetricFamily(
                "qmgrd_queue_oldest_message_age_seconds",
                "Age of the oldest message per spool queue, from its queue id (0 when empty).",
                labels=("queue",),
            )
            for queue, age in sorted(ages.items()):
                oldest.add_metric((queue,), age)
            yield oldest
        build = GaugeMetricFamily(
            "qmgrd_build_info", "qmgrd's version and Python's; always 1.",
            labels=("version", "python"),
        )
        build.add_metric((__version__, platform.python_version()), 1)
        yield build
        if metrics.status_fn is not None:
            status = metrics.status_fn()
            yield from _status_metrics(status, metrics.top_destinations)
            yield from _admission_metrics(status)


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, value=value)


def _admission_metrics(status: EngineStatus) -> Iterable[Metric]:
    """Fair admission per flow: the top flows of the snapshot and ``other`` (bounded labels)."""
    waiting = GaugeMetricFamily(
        "qmgrd_flow_messages_waiting",
        "Messages of a flow waiting for the active queue (top flows, the rest as 'other').",
        labels=["flow"],
    )
    active = GaugeMetricFamily(
        "qmgrd_flow_messages_active",
        "Messages of a flow admitted to the active queue (top flows, the rest as 'other').",
        labels=["flow"],
    )
    for row in status.admission:
        label = row.label or "none"
        waiting.add_metric([label], row.waiting)
        active.add_metric([label], row.active)
    yield waiting
    yield active


def _status_metrics(status: EngineStatus, top: int) -> Iterable[Metric]:
    """Translate the engine's snapshot into gauges (see the module doc)."""
    yield _gauge("qmgrd_uptime_seconds", "Seconds since the engine started.", status.uptime)
    yield _gauge(
        "qmgrd_messages_in_core",
        "Messages in the active queue (qmgr_message_active_limit bounds it).",
        status.messages_in_core,
    )
    yield _gauge(
        "qmgrd_recipients_in_core",
        "Recipients in core (bounded by qmgr_message_recipient_minimum * "
        "qmgr_message_active_limit + the transports' recipient slot pools + "
        "max(0, qmgr_message_recipient_limit - qmgr_message_recipient_minimum)).",
        status.recipients_in_core,
    )
    yield _gauge(
        "qmgrd_messages_waiting",
        "Queue files found in incoming/ or due in deferred/, waiting for room in core.",
        status.messages_waiting,
    )
    for name, value in sorted(status.stats):
        yield CounterMetricFamily(
            f"qmgrd_engine_{name}", f"Engine counter {name} since start.", value=value
        )
    yield from destination_state_metrics(dict(status.destination_state))  # cluster

    t_busy = GaugeMetricFamily(
        "qmgrd_transport_busy", "Deliveries in progress per transport.", labels=("transport",)
    )
    t_dead = GaugeMetricFamily(
        "qmgrd_transport_dead",
        "1 if the transport is dead (its agent failed; no deliveries until it revives).",
        labels=("transport",),
    )
    t_dests = GaugeMetricFamily(
        "qmgrd_transport_destinations",
        "Destination queues in core per transport.",
        labels=("transport",),
    )
    t_dead_dests = GaugeMetricFamily(
        "qmgrd_transport_dead_destinations",
        "Dead (throttled) destinations per transport.",
        labels=("transport",),
    )
    d_labels = ("transport", "destination")
    d_window = GaugeMetricFamily(
        "qmgrd_destination_window",
        "Concurrency window of the busiest destinations (0 = dead, -1 = suspended).",
        labels=d_labels,
    )
    d_busy = GaugeMetricFamily(
        "qmgrd_destination_busy", "Deliveries in progress to the destination.", labels=d_labels
    )
    d_todo = GaugeMetricFamily(
        "qmgrd_destination_todo", "Recipient entries waiting for the destination.", labels=d_labels
    )
    d_dead = GaugeMetricFamily(
        "qmgrd_destination_dead",
        "1 for each dead destination (at most the top N by waiting entries).",
        labels=d_labels,
    )
    ranked: list[tuple[int, int, str, str, DestinationStatus]] = []
    dead_ranked: list[tuple[int, str, str]] = []
    for transport in status.transports:
        name = transport.name
        t_busy.add_metric((name,), transport.busy)
        t_dead.add_metric((name,), 1 if transport.dead else 0)
        t_dests.add_metric((name,), len(transport.queues))
        dead = 0
        for queue in transport.queues:
            ranked.append((queue.busy, queue.todo, name, queue.name, queue))
            if queue.state == "dead":
                dead += 1
                dead_ranked.append((queue.todo, name, queue.name))
        t_dead_dests.add_metric((name,), dead)
    ranked.sort(key=lambda r: (-r[0], -r[1], r[2], r[3]))
    for busy, todo, name, dest, queue in ranked[:top]:
        d_window.add_metric((name, dest), queue.window)
        d_busy.add_metric((name, dest), busy)
        d_todo.add_metric((name, dest), todo)
    dead_ranked.sort(key=lambda r: (-r[0], r[1], r[2]))
    for _todo, name, dest in dead_ranked[:top]:
        d_dead.add_metric((name, dest), 1)
    yield from (t_busy, t_dead, t_dests, t_dead_dests, d_window, d_busy, d_todo, d_dead)
    yield from flow_metrics(status)  # bounded: top flows + "other" (qmgrd.daemon.metrics_flows)
