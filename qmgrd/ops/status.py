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

    transport smtp: busy 2
      destination                 window busy todo state
      example.com                      5    2    0 ready
      example.net                      1    0    3 dead (connect to ...: refused)
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, TextIO

from qmgrd.daemon.control import control_socket_path
from qmgrd.ops.client import call

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
        out.write(f"qmgrd: {destination}: retrying {count} deferred message{plural}\n")
        return 0
    if queue_id is not None:
        reply = call(path, {"op": "flush", "queue_id": queue_id})
        if not reply.get("found"):
            err.write(f"qmgrd: warning: {queue_id}: no such message in the deferred queue\n")
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
        out.write(json.dumps(reply, indent=2, sort_keys=True) + "\n")
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


def format_status(status: dict[str, Any]) -> str:
    """The status reply (without ``ok``) as text for a person (see the module doc)."""
    lines = [f"qmgrd: pid {status.get('pid', '?')}, up {format_uptime(status.get('uptime', 0))}"]
    files = status.get("queue_files") or {}
    if files:
        lines.append("queue files: " + ", ".join(f"{q} {n}" for q, n in files.items()))
    lines.append(
        f"in core: {status.get('messages_in_core', 0)} messages, "
        f"{status.get('recipients_in_core', 0)} recipients; "
        f"{status.get('messages_waiting', 0)} waiting to be loaded"
    )
    stats = status.get("stats") or {}
    if stats:
        lines.append("counters: " + ", ".join(f"{k}={v}" for k, v in stats.items()))
    for transport in status.get("transports") or []:
        lines.append("")
        head = f"transport {transport.get('name')}: busy {transport.get('busy', 0)}"
        if transport.get("dead"):
            reason = transport.get("reason")
            head += " DEAD" + (f" ({reason})" if reason else "")
        lines.append(head)
        queues = transport.get("queues") or []
        if not queues:
            lines.append("  no destinations in core")
            continue
        width = max(len("destination"), *(len(str(q.get("name", ""))) for q in queues))
        lines.append(f"  {'destination':<{width}} window busy todo state")
        for q in queues:
            state = str(q.get("state", "?"))
            if q.get("reason"):
                state += f" ({q['reason']})"
            window = q.get("window", 0)
            window_text = f"{window:g}" if isinstance(window, float) else str(window)
            lines.append(
                f"  {q.get('name', '')!s:<{width}} {window_text:>6} {q.get('busy', 0):>4} "
                f"{q.get('todo', 0):>4} {state}"
            )
    return "\n".join(lines) + "\n"
