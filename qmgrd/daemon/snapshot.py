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
                                 "state": "ready", "reason": null}]}],
     "destination_state": {"backend": "redis://10.0.0.5:6379/0", "connected": true, ...}}

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
from qmgrd.core.scheduler import Scheduler
from qmgrd.daemon.context import EngineStats

__all__ = ["DestinationStatus", "EngineStatus", "StatusReply", "TransportStatus", "take_snapshot"]


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

    def to_json(self) -> dict[str, Any]:
        """The wire form."""
        return {
            "name": self.name,
            "dead": self.dead,
            "busy": self.busy,
            "reason": self.reason,
            "queues": [q.to_json() for q in self.queues],
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


def _opt_str(value: object) -> str | None:
    return None if value is None else str(value)
