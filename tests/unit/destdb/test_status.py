"""The shared destination state in ``qmgrd status`` and in the metrics."""

from __future__ import annotations

from qmgrd.daemon.metrics_cluster import destination_state_metrics
from qmgrd.daemon.snapshot import EngineStatus
from qmgrd.ops.status import format_status

STATE = {
    "backend": "redis://10.0.0.5:6379/0",
    "connected": False,
    "fallback_seconds": 12.5,
    "outages": 1,
    "round_trips": 420,
    "postponed": 7,
    "held_dead": 2,
    "learned": 3,
}


def test_status_shows_the_backend_and_the_fallback() -> None:
    """A node on local fallback limits says so in ``qmgrd status``; the wire form keeps it."""
    core = EngineStatus(0.0, 0, 0, 0, (), (), destination_state=tuple(STATE.items()))
    wire = {"pid": 1, **core.to_json()}
    assert EngineStatus.from_json(wire).destination_state == core.destination_state
    text = format_status(wire)
    line = next(x for x in text.splitlines() if x.startswith("destination state:"))
    assert "redis://10.0.0.5:6379/0 UNREACHABLE, on local limits" in line
    assert "outages=1" in line and "round_trips=420" in line


def test_no_gate_no_line() -> None:
    """Without a destination gate the reply and the text have no destination state."""
    core = EngineStatus(0.0, 0, 0, 0, (), ())
    assert "destination_state" not in core.to_json()
    assert "destination state" not in format_status({"pid": 1, **core.to_json()})


def test_metrics() -> None:
    """Connected gauge 0 on fallback; outages and round trips as counters."""
    families = {f.name: f.samples[0].value for f in destination_state_metrics(STATE)}
    assert families["qmgrd_destination_state_connected"] == 0.0
    assert families["qmgrd_destination_state_outages"] == 1.0
    assert families["qmgrd_destination_state_round_trips"] == 420.0
    assert families["qmgrd_destination_state_learned"] == 3.0
    assert list(destination_state_metrics({})) == []


def test_local_backend_line() -> None:
    """The default backend says it is this node's alone."""
    core = EngineStatus(
        0.0, 0, 0, 0, (), (), destination_state=(("backend", "local"), ("postponed", 0))
    )
    assert "destination state: local (this node only); postponed=0" in format_status(
        {"pid": 1, **core.to_json()}
    )
