"""The status text for a person: uptime, file counts, counters, transports and destinations."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest

from qmgrd.ops import status as status_module
from qmgrd.ops.status import format_status, format_uptime


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0, "0s"), (42.9, "42s"), (61, "1m 01s"), (3723, "1h 02m 03s"),
     (3 * 86400 + 4 * 3600 + 5 * 60 + 6, "3d 04h 05m 06s"), (-5, "0s")],
)
def test_uptime(seconds: float, text: str) -> None:
    """Uptime drops leading zero units and pads the rest to two digits."""
    assert format_uptime(seconds) == text


def test_status_text() -> None:
    """Every part of the status reply appears, destinations in a table with their state."""
    status = {
        "pid": 4242,
        "uptime": 3723.5,
        "queue_files": {"incoming": 0, "active": 2, "deferred": 5, "hold": 1, "corrupt": 0},
        "messages_in_core": 2,
        "recipients_in_core": 7,
        "messages_waiting": 1,
        "stats": {"messages_loaded": 12, "recipients_sent": 10},
        "transports": [
            {
                "name": "smtp",
                "dead": False,
                "busy": 2,
                "reason": None,
                "queues": [
                    {"name": "example.com", "nexthop": "example.com", "window": 5, "busy": 2,
                     "todo": 0, "state": "ready", "reason": None},
                    {"name": "mail.example.net", "nexthop": "mail.example.net", "window": 1.5,
                     "busy": 0, "todo": 3, "state": "dead",
                     "reason": "4.4.1 connect to mail.example.net: Connection refused"},
                ],
            },
            {"name": "retry", "dead": True, "busy": 0, "reason": "4.3.0 agent crashed",
             "queues": []},
        ],
    }
    assert format_status(status).splitlines() == [
        "qmgrd: pid 4242, up 1h 02m 03s",
        "queue files: incoming 0, active 2, deferred 5, hold 1, corrupt 0",
        "in core: 2 messages, 7 recipients; 1 waiting to be loaded",
        "counters: messages_loaded=12, recipients_sent=10",
        "",
        "transport smtp: busy 2",
        "  destination      window busy todo state",
        "  example.com           5    2    0 ready",
        "  mail.example.net    1.5    0    3 dead"
        " (4.4.1 connect to mail.example.net: Connection refused)",
        "",
        "transport retry: busy 0 DEAD (4.3.0 agent crashed)",
        "  no destinations in core",
    ]


def test_status_text_tolerates_missing_fields() -> None:
    """A minimal reply (older or newer daemon) still renders without errors."""
    assert format_status({}).splitlines() == [
        "qmgrd: pid ?, up 0s",
        "in core: 0 messages, 0 recipients; 0 waiting to be loaded",
    ]


def test_status_text_escapes_foreign_text() -> None:
    """Destination names and remote replies with control characters reach the terminal escaped."""
    status = {
        "transports": [
            {
                "name": "smtp",
                "dead": True,
                "busy": 0,
                "reason": "4.3.0 \x1b]0;owned\x07",
                "queues": [
                    {"name": "ex\x1bample.com", "nexthop": "x", "window": 1, "busy": 0,
                     "todo": 1, "state": "dead", "reason": "421 \u202eevil\r\n"},
                ],
            }
        ]
    }
    text = format_status(status)
    assert "\x1b" not in text and "\u202e" not in text and "\r" not in text
    assert "transport smtp: busy 0 DEAD (4.3.0 \\x1b]0;owned\\x07)" in text
    assert "  ex\\x1bample.com      1    0    1 dead (421 \\u202eevil\\r\\n)" in text.splitlines()


def test_status_json_is_terminal_safe_and_exact(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``status --json`` escapes DEL, C1 and bidi characters and decodes to the same reply."""
    reply: dict[str, Any] = {"ok": True, "pid": 1, "transports": [{"name": "x\x7f\x9b\u202e"}]}
    monkeypatch.setattr(status_module, "call", lambda path, request: dict(reply))
    out = io.StringIO()
    assert status_module.status_command(tmp_path, as_json=True, out=out) == 0
    text = out.getvalue()
    assert text.isascii() and text.endswith("\n") and text.count("\n") == 1
    assert json.loads(text) == {"pid": 1, "transports": [{"name": "x\x7f\x9b\u202e"}]}
