"""Logging: structlog events rendered as Postfix-shaped lines or JSON.

Every component logs structured events with fixed field names (STYLE §12);
tests capture the events with ``structlog.testing.capture_logs`` instead of
parsing text. The Postfix renderer turns an event into the shape operators
and log tools expect::

    3F9A2B: to=<a@example.com>, relay=mx[127.0.0.1]:25, ..., status=sent (250 ok)

Conventions for callers:

- ``queue_id`` becomes the ``ID:`` prefix; events without it are rendered
  as plain text (``event`` then the fields).
- Field names map to Postfix keys: a trailing underscore is dropped
  (``from_`` → ``from``), so ``from_`` can be passed as a keyword.
- ``status`` with ``reply`` renders as ``status=sent (reply)``.
- The event name itself is not printed for queue-id events unless it is a
  free-text message such as ``removed`` (pass ``text=True``-style events by
  giving no other fields).
- Values from the network are escaped: CR, LF and other control characters
  become ``\\r``, ``\\n``, ``\\xNN``, so one event is one line.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import MutableMapping
from typing import Any, Literal, TextIO

import structlog

LogFormat = Literal["postfix", "json"]

_SKIP_KEYS = frozenset({"event", "queue_id", "level", "timestamp", "component", "reply", "logger"})


def escape(value: object) -> str:
    """Render a value on one line, escaping control characters from the network."""
    text = str(value)
    if text.isprintable():
        return text
    out: list[str] = []
    for ch in text:
        if ch == "\r":
            out.append("\\r")
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\t":
            out.append("\\t")
        elif not ch.isprintable():
            out.append(f"\\x{ord(ch):02x}" if ord(ch) < 256 else f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    return "".join(out)


def render_postfix(event_dict: MutableMapping[str, Any]) -> str:
    """Render one event as a Postfix-style log message (without the syslog prefix)."""
    event = escape(event_dict.get("event", ""))
    queue_id = event_dict.get("queue_id")
    parts: list[str] = []
    for key, value in event_dict.items():
        if key in _SKIP_KEYS or value is None:
            continue
        name = key[:-1] if key.endswith("_") else key
        text = escape(value)
        if name == "status" and event_dict.get("reply") is not None:
            text = f"{text} ({escape(event_dict['reply'])})"
        parts.append(f"{name}={text}")
    fields = ", ".join(parts)
    if queue_id is not None:
        if not parts:
            return f"{queue_id}: {event}"
        if event and not event.isidentifier():
            # A free-text event (e.g. "removed" variants) precedes the fields.
            return f"{queue_id}: {event}, {fields}"
        return f"{queue_id}: {fields}"
    return f"{event}: {fields}" if fields else event


def _postfix_renderer(
    _logger: Any, _method: str, event_dict: MutableMapping[str, Any]
) -> str:
    level = event_dict.get("level", "info")
    line = render_postfix(event_dict)
    if level in ("warning", "error", "critical"):
        line = f"{level}: {line}"
    return line


def configure_logging(
    log_format: LogFormat = "postfix", stream: TextIO | None = None, level: int = logging.INFO
) -> None:
    """Configure structlog for the process; called once by the CLI (the only global setup)."""
    renderer: Any
    if log_format == "json":
        renderer = structlog.processors.JSONRenderer()
    else:
        renderer = _postfix_renderer
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True)
            if log_format == "json"
            else _identity,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(level),
        logger_factory=structlog.PrintLoggerFactory(stream or sys.stdout),
        cache_logger_on_first_use=False,
    )


def _identity(
    _logger: Any, _method: str, event_dict: MutableMapping[str, Any]
) -> MutableMapping[str, Any]:
    return event_dict


def get_logger(component: str) -> Any:
    """A logger bound to a component name (``smtpd``, ``qmgr``, ``smtp``, ...)."""
    return structlog.get_logger().bind(component=component)
