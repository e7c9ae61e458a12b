"""The delivery metrics keep their labelled series once made (``Metrics`` child caches)."""

from __future__ import annotations

import pytest

from qmgrd.daemon.metrics import Metrics
from qmgrd.daemon.snapshot import EngineStatus


def _metrics() -> Metrics:
    status = {"messages": 0, "recipients": 0, "transports": []}
    return Metrics(lambda: EngineStatus.from_json(status), lambda: {})


def test_attempts_count_per_transport_through_the_kept_series() -> None:
    """Each attempt lands in its transport's series, however many there are."""
    metrics = _metrics()
    for seconds in (0.01, 0.02, 3.0):
        metrics.record_attempt("smtp", seconds)
    metrics.record_attempt("relay", -1.0)  # a clock step back counts as 0
    sample = metrics.registry.get_sample_value
    assert sample("qmgrd_delivery_attempt_seconds_count", {"transport": "smtp"}) == 3
    total = sample("qmgrd_delivery_attempt_seconds_sum", {"transport": "smtp"})
    assert total == pytest.approx(3.03)
    assert sample("qmgrd_delivery_attempt_seconds_count", {"transport": "relay"}) == 1
    assert sample("qmgrd_delivery_attempt_seconds_sum", {"transport": "relay"}) == 0.0
    assert metrics.attempt.labels("smtp") is metrics._attempt_children["smtp"]
