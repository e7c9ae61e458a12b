"""Flows in ``qmgrd status`` and the metrics: share, backlog, weight; bounded labels."""

from __future__ import annotations

from qmgrd.core import Entry, TransportParams
from qmgrd.core.flow import Flow
from qmgrd.daemon.context import EngineStats
from qmgrd.daemon.metrics import Metrics
from qmgrd.daemon.snapshot import FLOW_TOP, EngineStatus, StatusReply, take_snapshot
from qmgrd.ops.status import format_status
from tests.unit.core.schedsim import Sim

FAIR = TransportParams(process_limit=4, destination_concurrency_limit=0, fairness=True)
A = Flow("sender_domain:a.test")
H = Flow("tenant:heavy", 2.0, "heavy")


def _sim_with_two_flows() -> tuple[Sim, list[Entry]]:
    sim = Sim({"smtp": FAIR, "relay": TransportParams()})
    for i in range(10):
        sim.add(f"a{i}", [("smtp", f"a{i}")], flow=A)
    for i in range(4):
        sim.add(f"h{i}", [("smtp", f"h{i}")], flow=H)
    sim.add("r", [("relay", "r")], flow=A)  # relay has fairness off: no flows there
    busy = []
    while (entry := sim.sched.select(sim.now)) is not None:
        busy.append(entry)
    return sim, busy


def _status(sim: Sim) -> EngineStatus:
    return take_snapshot(sim.sched, EngineStats(), 0, 1.0)


def test_snapshot_lists_each_flow_with_weight_backlog_and_deliveries() -> None:
    """A transport with fairness on lists its flows: weight, jobs, TODO backlog, deliveries;
    the wire form reads back the same; a transport with fairness off lists none."""
    sim, busy = _sim_with_two_flows()
    status = _status(sim)
    smtp = next(t for t in status.transports if t.name == "smtp")
    relay = next(t for t in status.transports if t.name == "relay")
    assert not relay.fair and relay.flows == ()
    assert smtp.fair and smtp.flows_total == 2
    by_label = {f.label: f for f in smtp.flows}
    smtp_busy = [e for e in busy if e.transport == "smtp"]
    delivered_a = sum(1 for e in smtp_busy if e.message.flow == A)
    assert by_label["heavy"].weight == 2.0 and by_label[A.label].weight == 1.0
    assert by_label[A.label].delivered == delivered_a
    assert by_label["heavy"].delivered == len(smtp_busy) - delivered_a
    assert by_label[A.label].backlog == 10 - delivered_a
    assert by_label[A.label].jobs + by_label["heavy"].jobs == 14 - len(smtp_busy)
    again = StatusReply.from_json({"pid": 1, **status.to_json()}).engine
    assert again == status


def test_status_text_shows_the_flow_table_with_shares() -> None:
    """``qmgrd status`` prints a flow table with weight, backlog, delivered and share."""
    sim, busy = _sim_with_two_flows()
    for entry in busy:
        sim.sched.entry_done(entry, now=sim.now, service_time=0.1)
    text = format_status({"pid": 7, **_status(sim).to_json()})
    assert "  flows: 2 (fair queuing; share = delivered / all delivered)" in text
    header = next(line for line in text.splitlines() if "weight jobs backlog" in line)
    assert header.split() == ["flow", "weight", "jobs", "backlog", "delivered", "share"]
    heavy = next(line for line in text.splitlines() if line.strip().startswith("heavy"))
    assert heavy.split()[1] == "2" and heavy.endswith("%")


def test_many_flows_are_bounded_to_the_top_and_other() -> None:
    """A thousand sender domains give at most FLOW_TOP flow rows plus one 'other' row, in the
    status and in the metrics' label set."""
    sim = Sim({"smtp": FAIR})
    for i in range(1000):
        sim.add(f"m{i}", [("smtp", f"d{i}")] * (1 + i % 3), flow=Flow(f"sender_domain:s{i}.test"))
    status = _status(sim)
    (smtp,) = status.transports
    assert smtp.flows_total == 1000
    assert len(smtp.flows) == FLOW_TOP + 1 and smtp.flows[-1].label == "other"
    assert sum(f.jobs for f in smtp.flows) == 1000
    assert [f.backlog for f in smtp.flows[:FLOW_TOP]] == sorted(
        (f.backlog for f in smtp.flows[:FLOW_TOP]), reverse=True
    )
    text = Metrics(status_fn=lambda: status).generate().decode()
    backlog_series = [ln for ln in text.splitlines() if ln.startswith("qmgrd_flow_backlog{")]
    assert len(backlog_series) == FLOW_TOP + 1
    assert 'qmgrd_flow_backlog{flow="other",transport="smtp"}' in text
    assert 'qmgrd_transport_flows{transport="smtp"} 1000.0' in text


def test_no_flow_series_without_fairness() -> None:
    """Fairness none (the default): no delivery-scheduler flow series at all."""
    sim = Sim({"smtp": TransportParams()})
    sim.add("m", [("smtp", "d")], flow=A)
    text = Metrics(status_fn=lambda: _status(sim)).generate().decode()
    for name in ("backlog", "jobs", "delivered", "weight"):
        assert f"qmgrd_flow_{name}" not in text
    assert "qmgrd_transport_flows" not in text
