"""The status snapshot: what the engine holds in core, as typed values.

Contract
--------
``take_snapshot(scheduler, stats, table, uptime) -> EngineStatus`` reads the
scheduler and the engine's counters on the event loop (no I/O, no await) and
returns frozen dataclasses. The control socket (``status``), the metrics
endpoint and ``qmgrd status`` read these types, never ad-hoc dicts.

On the wire (the control socket's ``status`` reply, ``qmgrd status --json``)
the snapshot is ``EngineStatus.to_json()``: the JSON shape documented in
``qmgrd.daemon.control`` and ``docs/``::

    {"uptime": 12.5, "messages_in_core": 7, "recipients_in_core": 42,
     "messages_waiting": 3, "stats": {"deliveries": 9, ...},
     "admission": [{"flow": "sender_domain:bulk.example", "waiting": 3, "active": 7}],
     "transports": [{"name": "smtp", "dead": false, "busy": 4, "reason": null,
                     "queues": [{"name": "example.com", "nexthop": "example.com",
                                 "window": 5, "busy": 2, "todo": 0,
                                 "state": "ready", "reason": null}],
                     "fair": true, "flows_total": 2,
                     "flows": [{"label": "sender_domain:a.example", "weight": 1.0,
                                "jobs": 3, "backlog": 40, "delivered": 12}]}],
     "destination_state": {"backend": "redis://10.0.0.5:6379/0", "connected": true, ...}}

Flows (fair queuing, ``qmgrd.core.fairq``) are listed only for transports with fairness on:
the ``FLOW_TOP`` flows with the largest backlog (TODO entries in core), then one ``other``
entry summing the rest, so a sender who makes thousands of flows cannot make the reply or the
metrics' label set grow (the tenant name ``other`` is reserved for it). ``delivered`` counts
deliveries since the flow last became known (it is forgotten when it has no job in core);
``weight`` of ``other`` is 0.

``destination_state`` (the cluster backend's state, ``qmgrd.daemon.destgate``) is present
only when a gate is configured.

``StatusReply.from_json(reply)`` reads such a reply back (the CLI side),
leniently: a missing field takes its zero value, so an older or newer daemon
still prints.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from qmgrd.core.admission import FlowBacklog
from qmgrd.core.fairq import FairSet
from qmgrd.core.scheduler import Scheduler
from qmgrd.daemon.context import EngineStats

__all__ = [
    "FLOW_TOP",
    "DestinationStatus",
    "EngineStatus",
    "FlowStatus",
    "StatusReply",
    "TransportStatus",
    "take_snapshot",
]

FLOW_TOP = 20
"""Flows listed per transport; the rest are summed in one ``other`` entry."""
OTHER = "other"


@dataclass(frozen=True, slots=True)
class FlowStatus:
    """One flow of a transport with fairness on (or ``other``: the sum of the rest)."""

    label: str
    weight: float
    jobs: int
    backlog: int  # TODO entries in core
    delivered: int

    def to_json(self) -> dict[str, Any]:
        """The wire form."""
        return {
            "label": self.label,
            "weight": self.weight,
            "jobs": self.jobs,
            "backlog": self.backlog,
            "delivered": self.delivered,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> FlowStatus:
        """Read the wire form back (missing fields: zero values)."""
        weight = data.get("weight", 0.0)
        return cls(
            label=str(data.get("label", "")),
            weight=float(weight) if isinstance(weight, int | float) else 0.0,
            jobs=int(data.get("jobs", 0)),
            backlog=int(data.get("backlog", 0)),
            delivered=int(data.get("delivered", 0)),
        )


@dataclass(frozen=True, slots=True)
class DestinationStatus:
    """One destination queue in core."""

    name: str
    nexthop: str
    window: int | float
    busy: int
    todo: int
    state: str  # ready | suspended | dead
    reason: str | None = None

    def to_json(self) -> dict[str, Any]:
        """The wire form."""
        return {
            "name": self.name,
            "nexthop": self.nexthop,
            "window": self.window,
            "busy": self.busy,
            "todo": self.todo,
            "state": self.state,
            "reason": self.reason,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> DestinationStatus:
        """Read the wire form back (missing fields: zero values)."""
        window = data.get("window", 0)
        return cls(
            name=str(data.get("name", "")),
            nexthop=str(data.get("nexthop", data.get("name", ""))),
            window=window if isinstance(window, int | float) else 0,
            busy=int(data.get("busy", 0)),
            todo=int(data.get("todo", 0)),
            state=str(data.get("state", "?")),
            reason=_opt_str(data.get("reason")),
        )


@dataclass(frozen=True, slots=True)
class TransportStatus:
    """One transport in core with its destination queues."""

    name: str
    dead: bool
    busy: int
    reason: str | None
    queues: tuple[DestinationStatus, ...]
    fair: bool = False  # fair queuing between flows is on
    flows_total: int = 0  # flows known to the transport (listed or in ``other``)
    flows: tuple[FlowStatus, ...] = ()

    def to_json(self) -> dict[str, Any]:
        """The wire form."""
        return {
            "name": self.name,
            "dead": self.dead,
            "busy": self.busy,
            "reason": self.reason,
            "queues": [q.to_json() for q in self.queues],
            "fair": self.fair,
            "flows_total": self.flows_total,
            "flows": [f.to_json() for f in self.flows],
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> TransportStatus:
        """Read the wire form back (missing fields: zero values)."""
        return cls(
            name=str(data.get("name", "")),
            dead=bool(data.get("dead", False)),
            busy=int(data.get("busy", 0)),
            reason=_opt_str(data.get("reason")),
            queues=tuple(DestinationStatus.from_json(q) for q in data.get("queues") or ()),
            fair=bool(data.get("fair", False)),
            flows_total=int(data.get("flows_total", 0)),
            flows=tuple(FlowStatus.from_json(f) for f in data.get("flows") or ()),
        )


@dataclass(frozen=True, slots=True)
class EngineStatus:
    """The engine's snapshot (see the module doc)."""

    uptime: float
    messages_in_core: int
    recipients_in_core: int
    messages_waiting: int
    stats: tuple[tuple[str, int], ...]  # counter name and value, in declaration order
    transports: tuple[TransportStatus, ...]
    admission: tuple[FlowBacklog, ...] = ()  # fair admission: top flows by backlog + "other"
    # cluster: the destination state backend (qmgrd.daemon.destgate.DestGate.status)
    destination_state: tuple[tuple[str, Any], ...] = ()

    def to_json(self) -> dict[str, Any]:
        """The wire form."""
        out = {
            "uptime": self.uptime,
            "messages_in_core": self.messages_in_core,
            "recipients_in_core": self.recipients_in_core,
            "messages_waiting": self.messages_waiting,
            "stats": dict(self.stats),
            "transports": [t.to_json() for t in self.transports],
            "admission": _admission_to_json(self.admission),
        }
        if self.destination_state:
            out["destination_state"] = dict(self.destination_state)
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> EngineStatus:
        """Read the wire form back (missing fields: zero values)."""
        stats = data.get("stats") or {}
        return cls(
            uptime=float(data.get("uptime", 0.0)),
            messages_in_core=int(data.get("messages_in_core", 0)),
            recipients_in_core=int(data.get("recipients_in_core", 0)),
            messages_waiting=int(data.get("messages_waiting", 0)),
            stats=tuple((str(k), int(v)) for k, v in stats.items()
                        if isinstance(v, int | float)),
            transports=tuple(TransportStatus.from_json(t) for t in data.get("transports") or ()),
            admission=_admission_from_json(data.get("admission")),
            destination_state=tuple((data.get("destination_state") or {}).items()),
        )


@dataclass(frozen=True, slots=True)
class StatusReply:
    """The control socket's ``status`` reply: the daemon's pid, file counts, the snapshot."""

    pid: int | None
    queue_files: tuple[tuple[str, int], ...]
    engine: EngineStatus

    def to_json(self) -> dict[str, Any]:
        """The wire form (without ``ok``)."""
        return {
            "pid": self.pid,
            "queue_files": dict(self.queue_files),
            **self.engine.to_json(),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> StatusReply:
        """Read a reply back (missing fields: zero values)."""
        pid = data.get("pid")
        files = data.get("queue_files") or {}
        return cls(
            pid=pid if isinstance(pid, int) else None,
            queue_files=tuple((str(k), int(v)) for k, v in files.items()),
            engine=EngineStatus.from_json(data),
        )


def take_snapshot(
    scheduler: Scheduler,
    stats: EngineStats,
    waiting: int,
    uptime: float,
    *,
    admission: tuple[FlowBacklog, ...] = (),
    destination_state: Mapping[str, Any] | None = None,
) -> EngineStatus:
    """The engine's snapshot now (on the loop; see the module doc)."""
    transports = []
    for transport in scheduler.transports():
        queues = []
        for queue in transport.queues.values():
            window = queue.window
            state = "dead" if window.throttled else "suspended" if window.suspended else "ready"
            queues.append(
                DestinationStatus(
                    name=queue.name,
                    nexthop=queue.nexthop,
                    window=window.window,
                    busy=len(queue.busy),
                    todo=len(queue.todo),
                    state=state,
                    reason=" ".join(queue.dsn) if queue.dsn else None,
                )
            )
        transports.append(
            TransportStatus(
                name=transport.name,
                dead=transport.dead,
                busy=transport.busy,
                reason=" ".join(transport.dsn) if transport.dsn else None,
                queues=tuple(queues),
                fair=transport.fair is not None,
                flows_total=len(transport.fair.flows) if transport.fair is not None else 0,
                flows=_flows(transport.fair) if transport.fair is not None else (),
            )
        )
    return EngineStatus(
        uptime=round(uptime, 3),
        messages_in_core=scheduler.message_count,
        recipients_in_core=scheduler.rcpt_count,
        messages_waiting=waiting,
        stats=tuple((name, getattr(stats, name)) for name in stats.__slots__),
        transports=tuple(transports),
        admission=admission,
        destination_state=tuple((destination_state or {}).items()),
    )


def _admission_to_json(rows: tuple[FlowBacklog, ...]) -> list[dict[str, Any]]:
    return [{"flow": r.label, "waiting": r.waiting, "active": r.active} for r in rows]


def _admission_from_json(data: object) -> tuple[FlowBacklog, ...]:
    if not isinstance(data, list):
        return ()
    return tuple(
        FlowBacklog(str(r.get("flow", "")), int(r.get("waiting", 0)), int(r.get("active", 0)))
        for r in data
        if isinstance(r, dict)
    )


def _flows(fair: FairSet, top: int = FLOW_TOP) -> tuple[FlowStatus, ...]:
    """The ``top`` flows by backlog, then ``other`` (module doc); walks the linked jobs."""
    backlog: dict[str, int] = dict.fromkeys(fair.flows, 0)
    for queue in fair.queues:
        for fj in queue.jobs:
            job = fj.job
            backlog[fj.flow.key] = backlog.get(fj.flow.key, 0) + max(
                0, job.read_entries - job.selected_entries
            )
    rows = sorted(
        fair.flows.values(),
        key=lambda s: (-backlog.get(s.flow.key, 0), -s.dispatched, s.flow.key),
    )
    out = [
        FlowStatus(s.flow.label, s.flow.weight, s.jobs, backlog.get(s.flow.key, 0), s.dispatched)
        for s in rows[:top]
    ]
    rest = rows[top:]
    if rest:
        out.append(
            FlowStatus(
                OTHER,
                0.0,
                sum(s.jobs for s in rest),
                sum(backlog.get(s.flow.key, 0) for s in rest),
                sum(s.dispatched for s in rest),
            )
        )
    return tuple(out)


def _opt_str(value: object) -> str | None:
    return None if value is None else str(value)
