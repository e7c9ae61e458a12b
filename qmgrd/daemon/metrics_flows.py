"""Metrics of fair queuing between flows, read from the engine snapshot at scrape time.

Contract
--------
:func:`flow_metrics` turns the flows of an :class:`~qmgrd.daemon.snapshot.EngineStatus` into
gauges labelled ``transport`` and ``flow``. The snapshot already lists at most ``FLOW_TOP`` flows
per transport plus one ``other`` entry summing the rest, so the label set is bounded (at most
``FLOW_TOP + 1`` flows per transport with fairness on) whatever senders do; a label longer than
``LABEL_MAX`` characters is cut (it still identifies the flow to a person). Series:

- ``qmgrd_flow_backlog{transport,flow}``: TODO entries of the flow's jobs in core;
- ``qmgrd_flow_jobs{transport,flow}``: the flow's jobs (messages) linked on the transport;
- ``qmgrd_flow_delivered{transport,flow}``: deliveries since the flow became known (a gauge:
  a flow with nothing in core is forgotten, so it is no counter);
- ``qmgrd_flow_weight{transport,flow}``: its weight (``other``: 0);
- ``qmgrd_transport_flows{transport}``: flows known to the transport.
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client.core import GaugeMetricFamily, Metric

from qmgrd.daemon.snapshot import EngineStatus

__all__ = ["LABEL_MAX", "flow_metrics"]

LABEL_MAX = 100


def flow_metrics(status: EngineStatus) -> Iterable[Metric]:
    """The flow gauges of ``status`` (see the module doc); nothing without fairness."""
    fair = [t for t in status.transports if t.fair]
    if not fair:
        return
    labels = ("transport", "flow")
    backlog = GaugeMetricFamily(
        "qmgrd_flow_backlog", "Entries waiting per flow (top flows, then other).", labels=labels
    )
    jobs = GaugeMetricFamily(
        "qmgrd_flow_jobs", "Messages in core per flow on the transport.", labels=labels
    )
    delivered = GaugeMetricFamily(
        "qmgrd_flow_delivered",
        "Deliveries per flow since it became known (forgotten when it has nothing in core).",
        labels=labels,
    )
    weight = GaugeMetricFamily(
        "qmgrd_flow_weight", "Fair-queuing weight of the flow (other: 0).", labels=labels
    )
    count = GaugeMetricFamily(
        "qmgrd_transport_flows",
        "Flows known to a transport with fairness on.",
        labels=("transport",),
    )
    for transport in fair:
        count.add_metric((transport.name,), transport.flows_total)
        for flow in transport.flows:
            key = (transport.name, flow.label[:LABEL_MAX] or "none")
            backlog.add_metric(key, flow.backlog)
            jobs.add_metric(key, flow.jobs)
            delivered.add_metric(key, flow.delivered)
            weight.add_metric(key, flow.weight)
    yield from (count, backlog, jobs, delivered, weight)
