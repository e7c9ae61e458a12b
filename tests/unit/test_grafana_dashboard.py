"""docs/grafana-dashboard.json: valid Grafana JSON whose queries name only series qmgrd serves."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from qmgrd.daemon.metrics import Metrics
from qmgrd.daemon.snapshot import EngineStatus

DASHBOARD = Path(__file__).resolve().parents[2] / "docs" / "grafana-dashboard.json"
_SERIES = re.compile(r"\bqmgrd_[a-z_]+")


def _served_series() -> set[str]:
    """Sample names in a scrape of a Metrics fed one of each event and a dead destination."""
    queue = {
        "name": "example.com",
        "nexthop": "example.com",
        "window": 0,
        "busy": 0,
        "todo": 3,
        "state": "dead",
        "reason": "4.4.1 connection refused",
    }
    status = {
        "uptime": 1.0,
        "messages_in_core": 1,
        "recipients_in_core": 1,
        "messages_waiting": 0,
        "stats": {"deliveries": 1},
        "transports": [
            {"name": "smtp", "dead": False, "busy": 1, "reason": None, "queues": [queue]}
        ],
    }
    metrics = Metrics(
        lambda: EngineStatus.from_json(status),
        lambda: {"incoming": 0, "deferred": 1},
        queue_ages_fn=lambda: {"incoming": 0.0, "deferred": 600.0},
    )
    metrics.intake.connected()
    metrics.intake.session_started()
    metrics.intake.message_accepted(2)
    for state, dsn in (("sent", "2.0.0"), ("deferred", "4.4.1"), ("bounced", "5.1.1")):
        metrics.record_delivery("smtp", state, dsn, 1.0)
    metrics.record_attempt("smtp", 0.1)
    text = metrics.generate().decode()
    lines = [line for line in text.splitlines() if line.startswith("qmgrd_")]
    return {line.split("{")[0].split(" ")[0] for line in lines}


def _panels() -> list[dict[str, Any]]:
    dashboard = json.loads(DASHBOARD.read_text())
    panels: list[dict[str, Any]] = dashboard["panels"]
    return panels


def test_every_queried_series_is_served() -> None:
    """Each qmgrd_* name in a panel query appears in a real scrape (no typo, no future series)."""
    served = _served_series()
    exprs = [t["expr"] for p in _panels() for t in p.get("targets", [])]
    queried = {name for expr in exprs for name in _SERIES.findall(expr)}
    assert queried, "the dashboard queries nothing"
    assert queried <= served, f"not served: {sorted(queried - served)}"


def test_panels_fit_the_grid_and_have_unique_ids() -> None:
    """Panel ids are unique and every panel lies within Grafana's 24-column grid."""
    panels = _panels()
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids))
    for p in panels:
        grid = p["gridPos"]
        assert grid["x"] >= 0 and grid["x"] + grid["w"] <= 24, p["title"]
