"""A worker's ``load`` messages (session cap, loop lag) and their per-worker series."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from qmgrd.daemon.ipc import LoadReport, parse
from qmgrd.daemon.looplag import LAG_BUCKETS, LoopLag
from qmgrd.daemon.metrics_intake import IntakeMetrics


def test_load_messages_carry_the_new_lag_samples_and_sum_into_a_histogram_per_worker() -> None:
    lag = LoopLag()
    cap = [40]
    report = LoadReport(lag, lambda: cap[0])
    lag.observe(0.0005)
    lag.observe(0.3)
    first = parse(report.message())
    lag.observe(0.3)
    cap[0] = 30
    second = parse(report.message())
    assert first[1] == 40 and second[1] == 30
    assert sum(first[2]) == 2 and sum(second[2]) == 1  # deltas, not totals
    assert len(first[2]) == len(LAG_BUCKETS) + 1
    registry = CollectorRegistry()
    intake = IntakeMetrics(registry)
    intake.workers.load(2, first)
    intake.workers.load(2, second)
    intake.workers.sessions[2] = 5

    def value(name: str, **labels: str) -> float | None:
        return registry.get_sample_value(name, {"worker": "2", **labels})

    assert value("qmgrd_smtpd_worker_session_cap") == 30
    assert value("qmgrd_smtpd_worker_sessions") == 5
    assert value("qmgrd_smtpd_worker_event_loop_lag_seconds_count") == 3
    assert value("qmgrd_smtpd_worker_event_loop_lag_seconds_bucket", le="0.001") == 1
    assert value("qmgrd_smtpd_worker_event_loop_lag_seconds_bucket", le="0.2") == 1
    assert value("qmgrd_smtpd_worker_event_loop_lag_seconds_bucket", le="0.5") == 3
    assert value("qmgrd_smtpd_worker_event_loop_lag_seconds_bucket", le="1.0") == 3  # as Histogram
    assert value("qmgrd_smtpd_worker_event_loop_lag_seconds_sum") == pytest.approx(0.6005)
    assert registry.get_sample_value("qmgrd_smtpd_worker_session_cap", {"worker": "1"}) is None


@pytest.mark.parametrize(
    "bad",
    [["load", 1], ["load", "x", [0] * 14, 0], ["load", 1, [0], 0], ["load", 1, [-1] * 14, 0]],
)
def test_a_malformed_load_message_is_refused(bad: list[object]) -> None:
    with pytest.raises(ValueError):
        IntakeMetrics(CollectorRegistry()).workers.load(1, bad)
