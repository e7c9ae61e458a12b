"""Metrics of the shared destination state (cluster, ``qmgrd.daemon.destgate``).

Contract
--------
``destination_state_metrics(state)`` turns the gate's ``status()`` mapping (as carried in the
engine snapshot's ``destination_state``) into Prometheus families: a gauge
``qmgrd_destination_state_connected`` (Redis backends only) and counters for outages, round
trips, postponed deliveries, destinations held dead on another node's verdict and limits
learned from refusals and shared. An empty
mapping (no gate) yields nothing.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

__all__ = ["destination_state_metrics"]


def destination_state_metrics(state: dict[str, Any]) -> Iterable[Metric]:
    """Cluster (qmgrd.daemon.destgate): the shared destination state's health and counters."""
    if "connected" in state:
        yield GaugeMetricFamily(
            "qmgrd_destination_state_connected",
            "1 while the shared destination state (Redis) answers, 0 on local fallback limits.",
            value=1.0 if state["connected"] else 0.0,
        )
    for key, doc in (
        ("outages", "Times the shared destination state became unreachable."),
        ("round_trips", "Round trips to the shared destination state."),
        ("postponed", "Deliveries postponed by a cluster lease, rate or probe refusal."),
        ("held_dead", "Destinations held dead on another node's verdict."),
        ("learned", "Concurrency limits learned from a refusal and shared with the cluster."),
    ):
        if isinstance(state.get(key), int | float):
            yield CounterMetricFamily(
                f"qmgrd_destination_state_{key}", doc, value=float(state[key])
            )
