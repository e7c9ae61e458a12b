"""``qmgrd flush [-s DOMAIN | -i ID]``, ``qmgrd scan`` and ``qmgrd status``.

These need the daemon: without one they fail with ``qmgrd: fatal: the daemon
is not running (no control socket at PATH)`` (exit 1, raised as
``DaemonNotRunning`` and printed by the CLI).

``flush`` is ``postqueue -f`` (every deferred message is retried now and dead
destinations are forgotten), ``flush -s`` is ``postqueue -s`` for one
destination (prints how many messages it retries) and ``flush -i`` is
``postqueue -i`` for one message (exit 1 when it is not in ``deferred/``).

``status`` prints the daemon's status reply for a person (``--json``: the
reply itself)::

    qmgrd: pid 4242, up 1h 02m 03s
    queue files: incoming 0, active 2, deferred 5, hold 1, corrupt 0
    in core: 2 messages, 7 recipients; 0 waiting to be loaded
    counters: messages_loaded=12, ..., deliveries=14

    admission: flow                       waiting active
               sender_domain:bulk.example    9120     20
               sender_domain:shop.example       0      1

    transport smtp: busy 2
      destination                 window busy todo state
      example.com                      5    2    0 ready
      example.net                      1    0    3 dead (connect to ...: refused)
      flows: 2 (fair queuing; share = delivered / all delivered)
      flow                    weight jobs backlog delivered  share
      sender_domain:a.test         1   40      40        12  33.3%
      tenant:bulk                0.5    3     200        24  66.7%

The flow table appears for transports with fairness on; it lists at most
``FLOW_TOP`` flows by backlog and sums the rest in ``other``.

The admission lines (fair admission, issue 15) name the top flows by messages
waiting for the active queue; the rest are summed as ``other``.

Destination names, reasons (remote replies) and every other string of the
reply are foreign text: they are printed through ``qmgrd.textsafe.printable``
(``--json``: ``printable_json``, one line), so no control character reaches
the operator's terminal.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, TextIO

from qmgrd.core.admission import FlowBacklog
from qmgrd.daemon.control_socket import control_socket_path
from qmgrd.daemon.snapshot import StatusReply, TransportStatus
from qmgrd.ops.client import call
from qmgrd.textsafe import printable, printable_json

__all__ = ["flush_command", "format_status", "format_uptime", "scan_command", "status_command"]


def flush_command(
    queue_directory: Path,
    *,
    destination: str | None,
    queue_id: str | None,
    out: TextIO,
    err: TextIO,
) -> int:
    """``qmgrd flush``: ask the daemon to retry deferred mail now; the exit code."""
    path = control_socket_path(queue_directory)
    if destination is not None:
        reply = call(path, {"op": "flush", "destination": destination})
        count = int(reply.get("messages", 0))
        plural = "" if count == 1 else "s"
        out.write(f"qmgrd: {printable(destination)}: retrying {count} deferred message{plural}\n")
        return 0
    if queue_id is not None:
        reply = call(path, {"op": "flush", "queue_id": queue_id})
        if not reply.get("found"):
            err.write(
                f"qmgrd: warning: {printable(queue_id)}: no such message in the deferred queue\n"
            )
            return 1
        return 0
    call(path, {"op": "flush"})
    return 0


def scan_command(queue_directory: Path) -> int:
    """``qmgrd scan``: make the daemon look at ``incoming/`` again; 0."""
    call(control_socket_path(queue_directory), {"op": "scan"})
    return 0


def status_command(queue_directory: Path, *, as_json: bool, out: TextIO) -> int:
    """``qmgrd status [--json]``: print the daemon's status; 0."""
    reply = call(control_socket_path(queue_directory), {"op": "status"})
    reply.pop("ok", None)
    if as_json:
        out.write(printable_json(dict(sorted(reply.items()))) + "\n")
    else:
        out.write(format_status(reply))
    return 0


def format_uptime(seconds: float) -> str:
    """``3d 04h 05m 06s`` with leading zero units left out (``42s``, ``1h 02m 03s``)."""
    total = max(0, int(seconds))
    days, rest = divmod(total, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}d {hours:02d}h {minutes:02d}m {secs:02d}s"
    if hours:
        return f"{hours}h {minutes:02d}m {secs:02d}s"
    if minutes:
        return f"{minutes}m {secs:02d}s"
    return f"{secs}s"


def format_status(status: Mapping[str, Any]) -> str:
    """The status reply (without ``ok``) as text for a person (see the module doc)."""
    reply = StatusReply.from_json(status)
    core = reply.engine
    pid = "?" if reply.pid is None else str(reply.pid)
    lines = [f"qmgrd: pid {pid}, up {format_uptime(core.uptime)}"]
    if reply.queue_files:
        lines.append(
            "queue files: " + ", ".join(f"{printable(q)} {n}" for q, n in reply.queue_files)
        )
    lines.append(
        f"in core: {core.messages_in_core} messages, {core.recipients_in_core} recipients; "
        f"{core.messages_waiting} waiting to be loaded"
    )
    if core.stats:
        lines.append(
            "counters: " + ", ".join(f"{printable(k)}={printable(str(v))}" for k, v in core.stats)
        )
    lines.extend(_admission_lines(core.admission))
    if core.destination_state:  # cluster (qmgrd.daemon.destgate)
        state = dict(core.destination_state)
        if "connected" not in state:
            where = "(this node only)"
        else:
            where = "connected" if state["connected"] else "UNREACHABLE, on local limits"
        lines.append(
            f"destination state: {printable(str(state.get('backend', '?')))} {where}; "
            + ", ".join(
                f"{printable(str(k))}={printable(str(v))}"
                for k, v in core.destination_state
                if k not in ("backend", "connected")
            )
        )
    for transport in core.transports:
        lines.append("")
        lines.extend(_transport_lines(transport))
    return "\n".join(lines) + "\n"


def _admission_lines(rows: tuple[FlowBacklog, ...]) -> list[str]:
    """Fair admission: each top flow's messages waiting for and admitted to the active queue."""
    if not rows:
        return []
    names = [printable(r.label) for r in rows]
    width = max(len("flow"), *(len(name) for name in names))
    lines = ["", f"admission: {'flow':<{width}} waiting active"]
    for r, name in zip(rows, names, strict=True):
        lines.append(f"           {name:<{width}} {r.waiting:>7} {r.active:>6}")
    return lines


def _transport_lines(transport: TransportStatus) -> list[str]:
    head = f"transport {printable(transport.name)}: busy {transport.busy}"
    if transport.dead:
        head += " DEAD" + (f" ({printable(transport.reason)})" if transport.reason else "")
    if not transport.queues:
        return [head, "  no destinations in core"]
    names = [printable(q.name) for q in transport.queues]
    width = max(len("destination"), *(len(name) for name in names))
    lines = [head, f"  {'destination':<{width}} window busy todo state"]
    for q, name in zip(transport.queues, names, strict=True):
        state = printable(q.state) + (f" ({printable(q.reason)})" if q.reason else "")
        window = f"{q.window:g}" if isinstance(q.window, float) else str(q.window)
        lines.append(f"  {name:<{width}} {window:>6} {q.busy:>4} {q.todo:>4} {state}")
    if transport.fair:
        lines.extend(_flow_lines(transport))
    return lines


def _flow_lines(transport: TransportStatus) -> list[str]:
    """The flow table of a transport with fairness on (module doc)."""
    lines = [f"  flows: {transport.flows_total} (fair queuing; share = delivered / all delivered)"]
    if not transport.flows:
        return lines
    labels = [printable(f.label) for f in transport.flows]
    width = max(len("flow"), *(len(label) for label in labels))
    total = sum(f.delivered for f in transport.flows)
    lines.append(f"  {'flow':<{width}} weight jobs backlog delivered  share")
    for f, label in zip(transport.flows, labels, strict=True):
        share = f"{100.0 * f.delivered / total:5.1f}%" if total else "    -"
        weight = f"{f.weight:g}" if f.weight else "-"
        lines.append(
            f"  {label:<{width}} {weight:>6} {f.jobs:>4} {f.backlog:>7} {f.delivered:>9} {share}"
        )
    return lines
