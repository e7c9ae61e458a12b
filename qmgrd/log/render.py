"""Rendering one structlog event as a Postfix-shaped log message or a JSON line.

Pure functions, no I/O: :mod:`qmgrd.log` chooses where the text goes.

Conventions for callers (every component logs through ``get_logger``):

- ``queue_id`` becomes the ``ID:`` prefix; events without it are rendered
  as plain text (``event`` then the fields).
- Field names map to Postfix keys: a trailing underscore is dropped
  (``from_`` → ``from``), so ``from_`` can be passed as a keyword.
- ``status`` with ``reply`` renders as ``status=sent (reply)``.
- Values from the network are escaped: CR, LF and other control characters
  become ``\\r``, ``\\n``, ``\\xNN``, so one event is one line.

Shapes Postfix log tools match
------------------------------
Log tools (pflogsumm, fail2ban's ``postfix`` filter, postfix-logwatch, mtail)
match fixed regular expressions, so these events are rendered exactly as
Postfix writes them, whatever order the caller passed the fields in:

- a recipient outcome, any event with ``to`` and ``status``:
  ``ID: to=<a>, orig_to=<o>, relay=h[a]:25, conn_use=2, delay=1.2,
  delays=0.1/0/0.5/0.6, dsn=2.0.0, status=sent (reply)``;
- ``NOQUEUE: reject`` with ``stage``, ``client``, ``code``, ``reason`` (then
  ``to``, ``from_``, ``proto``, ``helo`` as given): ``NOQUEUE: reject: RCPT
  from c[a]: 554 5.7.1 <r>: Relay access denied; from=<s> to=<r> proto=ESMTP
  helo=<h>``;
- ``connect`` with ``client``: ``connect from unknown[127.0.0.1]``;
- ``disconnect`` with ``client`` and ``commands``: ``disconnect from
  unknown[127.0.0.1] ehlo=1 mail=1 rcpt=0/1 quit=1 commands=3/4``;
- ``lost connection``, ``timeout``, ``too many errors`` with ``client`` and
  ``after`` (``bytes`` optional): ``lost connection after DATA (1234 bytes)
  from unknown[127.0.0.1]``;
- ``SASL authentication failed`` (logged at warning) with ``client``,
  ``sasl_method``, ``reason`` and ``sasl_username`` (both optional):
  ``warning: unknown[127.0.0.2]: SASL LOGIN authentication failed:
  authentication failure, sasl_username=bob`` (Postfix 3.7's words, which
  fail2ban's stock ``postfix`` filter in ``auth`` mode bans on);
- ``SASL authentication aborted`` (warning) with ``client`` and
  ``sasl_method``: ``warning: unknown[127.0.0.2]: SASL LOGIN authentication
  aborted``.

``commands`` of ``disconnect`` maps a lower-case command name to the number
of times it succeeded and was given, ``{"ehlo": (1, 1), "rcpt": (0, 1)}``
(a plain int means all succeeded; :class:`qmgrd.log.session.CommandCounts`
keeps them). Commands are listed in Postfix's order
(helo ehlo xclient xforward starttls auth mail rcpt data bdat rset noop vrfy
etrn quit, then any other name, then ``unknown`` for unrecognised commands),
``name=N`` when all N succeeded, ``name=ok/total`` otherwise, and a final
``commands=`` total in the same form (Postfix 3.0+ smtpd). fail2ban's
``ddos`` mode matches ``auth=0/N`` there.

Fields Postfix does not print on a recipient line (``transport`` …) are left
out of the text; the JSON format keeps every field.

JSON format: one object per line, keys ``timestamp`` (UTC, ISO 8601),
``level``, ``component``, ``queue_id``, ``event``, then the event's fields
(``from_`` becomes ``from``). ``json.dumps`` escapes control characters; the
renderer also escapes the remaining non-printable characters (U+0085,
U+2028, ...) that some line-oriented readers treat as line breaks.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, MutableMapping
from datetime import UTC, datetime
from typing import Any

__all__ = [
    "POSTFIX_COMMAND_ORDER",
    "escape",
    "postfix_message",
    "render_json",
    "render_postfix",
    "syslog_prefix",
    "syslog_timestamp",
]

_SKIP_KEYS = frozenset({"event", "queue_id", "level", "timestamp", "component", "reply", "logger"})

# Postfix's order of the fields of a recipient outcome line (smtp/local/... delivery agents).
_RECIPIENT_KEYS = ("to", "orig_to", "relay", "conn_use", "delay", "delays", "dsn", "status")

_MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")


_LEVEL_PREFIXES = frozenset({"warning", "error", "critical"})


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


def _key(name: str) -> str:
    return name[:-1] if name.endswith("_") else name


def _status_text(event_dict: MutableMapping[str, Any]) -> str:
    text = escape(event_dict["status"])
    if event_dict.get("reply") is not None:
        text = f"{text} ({escape(event_dict['reply'])})"
    return text


def _recipient_line(event_dict: MutableMapping[str, Any]) -> str:
    """``to=<a>, relay=..., delay=..., delays=..., dsn=..., status=sent (reply)``."""
    by_key = {_key(k): v for k, v in event_dict.items() if v is not None}
    parts: list[str] = []
    for name in _RECIPIENT_KEYS:
        if name not in by_key:
            continue
        text = _status_text(event_dict) if name == "status" else escape(by_key[name])
        parts.append(f"{name}={text}")
    return ", ".join(parts)


def _reject_line(event_dict: MutableMapping[str, Any]) -> str:
    """``NOQUEUE: reject: RCPT from host[addr]: 554 5.7.1 <r>: reason; from=<s> to=<r>``."""
    to = event_dict.get("to")
    code = escape(event_dict["code"])
    head = f"{code} {escape(to)}: " if to is not None else f"{code} "
    tail: list[str] = []
    skip = {"stage", "client", "code", "reason"}
    for key, value in event_dict.items():
        if key in _SKIP_KEYS or key in skip or value is None:
            continue
        tail.append(f"{_key(key)}={escape(value)}")
    line = (
        f"NOQUEUE: reject: {escape(event_dict['stage'])} from {escape(event_dict['client'])}: "
        f"{head}{escape(event_dict['reason'])};"
    )
    return f"{line} {' '.join(tail)}" if tail else line


# smtpd's command table order (Postfix 3.x smtpd.c), the order of disconnect's counts.
POSTFIX_COMMAND_ORDER = (
    "helo",
    "ehlo",
    "xclient",
    "xforward",
    "starttls",
    "auth",
    "mail",
    "rcpt",
    "data",
    "bdat",
    "rset",
    "noop",
    "vrfy",
    "etrn",
    "quit",
)

# Postfix truncates the SASL method and user name to 100 characters (%.100s).
_SASL_FIELD_LIMIT = 100

_AFTER_EVENTS = frozenset({"lost connection", "timeout", "too many errors"})


def _count_text(value: object) -> tuple[str, int, int]:
    """``N`` or ``ok/total`` for one command count, with the two numbers."""
    if isinstance(value, int):
        return str(value), value, value
    if isinstance(value, (tuple, list)) and len(value) == 2:
        ok, total = int(value[0]), int(value[1])
        return (str(ok) if ok == total else f"{ok}/{total}"), ok, total
    raise TypeError(f"command count must be an int or (ok, total), not {value!r}")


def _disconnect_line(event_dict: Mapping[str, Any]) -> str:
    """``disconnect from c[a] ehlo=1 mail=1 rcpt=0/1 quit=1 commands=3/4``."""
    counts: Mapping[str, object] = event_dict.get("commands") or {}
    names = [n for n in POSTFIX_COMMAND_ORDER if n in counts]
    names += [n for n in counts if n not in POSTFIX_COMMAND_ORDER and n != "unknown"]
    if "unknown" in counts:
        names.append("unknown")
    parts = [f"disconnect from {escape(event_dict['client'])}"]
    all_ok = all_total = 0
    for name in names:
        text, ok, total = _count_text(counts[name])
        if total == 0:
            continue
        all_ok += ok
        all_total += total
        parts.append(f"{escape(name)}={text}")
    parts.append(f"commands={all_ok}" if all_ok == all_total else f"commands={all_ok}/{all_total}")
    return " ".join(parts)


def _after_line(event: str, event_dict: Mapping[str, Any]) -> str:
    """``lost connection after DATA (1234 bytes) from c[a]`` (also timeout, too many errors)."""
    after = escape(event_dict["after"])
    size = event_dict.get("bytes")
    if size is not None:
        after = f"{after} ({int(size)} bytes)"
    return f"{event} after {after} from {escape(event_dict['client'])}"


def _sasl_line(event: str, event_dict: Mapping[str, Any]) -> str:
    """``c[a]: SASL LOGIN authentication failed: reason, sasl_username=u`` (Postfix 3.7)."""
    client = escape(event_dict["client"])
    method = escape(str(event_dict["sasl_method"])[:_SASL_FIELD_LIMIT])
    if event == "SASL authentication aborted":
        return f"{client}: SASL {method} authentication aborted"
    reason = escape(event_dict.get("reason") or "authentication failure")
    user = escape(str(event_dict.get("sasl_username") or "")[:_SASL_FIELD_LIMIT])
    return f"{client}: SASL {method} authentication failed: {reason}, sasl_username={user}"


def _session_line(event: str, event_dict: Mapping[str, Any]) -> str | None:
    """The smtpd session shapes (connect, disconnect, lost connection, SASL), or None."""
    if event_dict.get("client") is None:
        return None
    if event == "connect":
        return f"connect from {escape(event_dict['client'])}"
    if event == "disconnect":
        return _disconnect_line(event_dict)
    if event in _AFTER_EVENTS and event_dict.get("after") is not None:
        return _after_line(event, event_dict)
    if (
        event in ("SASL authentication failed", "SASL authentication aborted")
        and event_dict.get("sasl_method") is not None
    ):
        return _sasl_line(event, event_dict)
    return None


def render_postfix(event_dict: MutableMapping[str, Any]) -> str:
    """Render one event as a Postfix-style log message (without the syslog prefix)."""
    event = escape(event_dict.get("event", ""))
    queue_id = event_dict.get("queue_id")
    if queue_id is None:
        session = _session_line(event, event_dict)
        if session is not None:
            return session
    if event == "NOQUEUE: reject" and all(
        event_dict.get(k) is not None for k in ("stage", "client", "code", "reason")
    ):
        return _reject_line(event_dict)
    if event_dict.get("to") is not None and event_dict.get("status") is not None:
        line = _recipient_line(event_dict)
        return f"{escape(queue_id)}: {line}" if queue_id is not None else line
    parts: list[str] = []
    for key, value in event_dict.items():
        if key in _SKIP_KEYS or value is None:
            continue
        name = _key(key)
        text = _status_text(event_dict) if name == "status" else escape(value)
        parts.append(f"{name}={text}")
    fields = ", ".join(parts)
    if queue_id is not None:
        queue_id = escape(queue_id)
        if not parts:
            return f"{queue_id}: {event}"
        if event and not event.isidentifier():
            # A free-text event (e.g. "removed" variants) precedes the fields.
            return f"{queue_id}: {event}, {fields}"
        return f"{queue_id}: {fields}"
    return f"{event}: {fields}" if fields else event


def render_json(event_dict: MutableMapping[str, Any], timestamp: float) -> str:
    """One event as one JSON object on one line (see the module doc for the keys)."""
    out: dict[str, Any] = {
        "timestamp": datetime.fromtimestamp(timestamp, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
        "level": event_dict.get("level", "info"),
        "component": event_dict.get("component"),
        "queue_id": event_dict.get("queue_id"),
        "event": event_dict.get("event", ""),
    }
    for key, value in event_dict.items():
        if key in ("event", "queue_id", "level", "timestamp", "component", "logger"):
            continue
        out[_key(key)] = value
    return _json_printable(json.dumps(out, ensure_ascii=False, default=str))


def _json_printable(text: str) -> str:
    """Escape what ``json.dumps(ensure_ascii=False)`` leaves raw but is not printable.

    json.dumps escapes only U+0000..U+001F; DEL, C1 controls (U+0085 is a line
    break to some readers), U+2028/U+2029 and format characters stay raw.
    They can only occur inside JSON strings, where ``\\uXXXX`` is valid.
    """
    if text.isprintable():
        return text
    out: list[str] = []
    for ch in text:
        if ch.isprintable():
            out.append(ch)
            continue
        code = ord(ch)
        if code > 0xFFFF:  # a surrogate pair, as JSON spells astral characters
            code -= 0x10000
            out.append(f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}")
        else:
            out.append(f"\\u{code:04x}")
    return "".join(out)


def syslog_prefix(
    timestamp: float, hostname: str, program: str, component: str | None, pid: int
) -> str:
    """``Mon DD HH:MM:SS host program/component[pid]: `` in local time, as syslog writes it.

    Month names are English whatever the locale (log tools parse them); the
    day is space-padded like syslog's ``%e``.
    """
    name = f"{program}/{component}" if component else program
    return f"{syslog_timestamp(timestamp)} {hostname} {name}[{pid}]: "


def syslog_timestamp(timestamp: float) -> str:
    """``Mon DD HH:MM:SS`` in local time (the start of ``syslog_prefix``)."""
    tm = time.localtime(timestamp)
    return (
        f"{_MONTHS[tm.tm_mon - 1]} {tm.tm_mday:2d} "
        f"{tm.tm_hour:02d}:{tm.tm_min:02d}:{tm.tm_sec:02d}"
    )


def postfix_message(event_dict: MutableMapping[str, Any]) -> str:
    """The Postfix text of an event, with ``warning:``/``error:`` as Postfix's msg_warn."""
    level = event_dict.get("level", "info")
    line = render_postfix(event_dict)
    if level in _LEVEL_PREFIXES:
        line = f"{level}: {line}"
    return line
