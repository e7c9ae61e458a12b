"""Logging: structlog events rendered as Postfix-shaped lines or JSON, to stdout or a file.

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

Postfix compatibility of the text format
----------------------------------------
Log tools (pflogsumm, postfix-logwatch, mtail's postfix program) match fixed
regular expressions, so two event shapes are rendered exactly as Postfix
writes them whatever order the caller passed the fields in:

- a recipient outcome (an event with ``to`` and ``status``): ``to=, orig_to=,
  relay=, conn_use=, delay=, delays=, dsn=, status=... (reply)`` in that
  order. Fields Postfix does not print there (``transport`` …) are left out
  of the text line, because anything between ``relay=`` and ``delay=`` or
  after the reply breaks those expressions; the JSON format keeps them.
- an SMTP reject (event ``NOQUEUE: reject`` with ``stage``, ``client``,
  ``code``, ``reason``): ``NOQUEUE: reject: RCPT from host[addr]: 554 5.7.1
  <rcpt>: reason; from=<s> to=<r> ...``.

Destinations
------------
:func:`configure_logging` is the process's one global logging setup (the
CLI calls it once). It returns a :class:`LogOutput`:

- no ``maillog_file``: lines go to ``stream`` (standard output by default,
  which systemd hands to journald, which adds time, host and identifier);
- ``maillog_file``: lines are appended to that file, line-buffered, each with
  the syslog prefix ``Mon DD HH:MM:SS host qmgrd/<component>[pid]: `` (local
  time, as syslog and Postfix's ``postlogd`` write it), so Postfix log tools
  work when told the program is called ``qmgrd``. ``/dev/stdout`` is a valid
  file name (Postfix's container convention): full prefixed lines on stdout.
  JSON lines are never prefixed: each line stays one JSON object.

``LogOutput.reopen()`` (or :func:`reopen_logs`, which finds the configured
output through structlog's configuration) closes and reopens the file for
log rotation; the daemon calls it on SIGHUP.

JSON format: one object per line, keys ``timestamp`` (UTC, ISO 8601),
``level``, ``component``, ``queue_id``, ``event``, then the event's fields
(``from_`` becomes ``from``). ``json.dumps`` escapes control characters; the
renderer also escapes the remaining non-printable characters (U+0085,
U+2028, ...) that some line-oriented readers treat as line breaks.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import sys
import threading
import time
from collections.abc import Callable, MutableMapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal, TextIO

import structlog

from qmgrd.errors import ConfigError

__all__ = [
    "LogFormat",
    "LogOutput",
    "configure_logging",
    "escape",
    "get_logger",
    "render_json",
    "render_postfix",
    "reopen_logs",
    "syslog_prefix",
]

LogFormat = Literal["postfix", "json"]

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


def render_postfix(event_dict: MutableMapping[str, Any]) -> str:
    """Render one event as a Postfix-style log message (without the syslog prefix)."""
    event = escape(event_dict.get("event", ""))
    queue_id = event_dict.get("queue_id")
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
    tm = time.localtime(timestamp)
    name = f"{program}/{component}" if component else program
    return (
        f"{_MONTHS[tm.tm_mon - 1]} {tm.tm_mday:2d} "
        f"{tm.tm_hour:02d}:{tm.tm_min:02d}:{tm.tm_sec:02d} {hostname} {name}[{pid}]: "
    )


def _postfix_renderer(_logger: Any, _method: str, event_dict: MutableMapping[str, Any]) -> str:
    """The Postfix text of an event, with ``warning:``/``error:`` as Postfix's msg_warn."""
    level = event_dict.get("level", "info")
    line = render_postfix(event_dict)
    if level in _LEVEL_PREFIXES:
        line = f"{level}: {line}"
    return line


class LogOutput:
    """Where rendered lines go: a stream, or an append-only file that can be reopened.

    It is also the structlog logger factory and logger (``msg`` and the level
    methods write one line), so :func:`reopen_logs` can find it through
    ``structlog.get_config()`` without module-level state.
    """

    def __init__(
        self,
        log_format: LogFormat = "postfix",
        stream: TextIO | None = None,
        *,
        maillog_file: str | os.PathLike[str] | None = None,
        hostname: str | None = None,
        program: str = "qmgrd",
        clock: Callable[[], float] = time.time,
    ) -> None:
        """Opens ``maillog_file`` now (ConfigError if it cannot be opened)."""
        if log_format not in ("postfix", "json"):
            raise ConfigError(f"log_format: unknown format {log_format!r}")
        self.log_format: LogFormat = log_format
        self.path = Path(maillog_file) if maillog_file else None
        self.hostname = hostname or socket.gethostname().split(".", 1)[0] or "localhost"
        self.program = program
        self.clock = clock
        self._stream = stream
        self._lock = threading.Lock()
        self._file: TextIO | None = None
        if self.path is not None:
            try:
                self._file = self._open(self.path)
            except OSError as exc:
                raise ConfigError(
                    f"maillog_file: cannot open {self.path}: {exc.strerror or exc}"
                ) from None

    @staticmethod
    def _open(path: Path) -> TextIO:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o640)
        return open(fd, "a", buffering=1, encoding="utf-8", errors="backslashreplace", closefd=True)

    # -- structlog processor and logger -------------------------------------------------

    def render(self, _logger: Any, _method: str, event_dict: MutableMapping[str, Any]) -> str:
        """The final structlog processor: the whole line, prefix included."""
        now = self.clock()
        if self.log_format == "json":
            return render_json(event_dict, now)
        line = _postfix_renderer(_logger, _method, event_dict)
        if self.path is None:
            return line
        component = event_dict.get("component")
        prefix = syslog_prefix(
            now,
            self.hostname,
            self.program,
            escape(component) if component else None,
            os.getpid(),
        )
        return prefix + line

    def __call__(self, *_args: Any) -> LogOutput:
        """structlog's logger factory: every logger writes through this output."""
        return self

    def msg(self, message: str) -> None:
        """Write one rendered line."""
        with self._lock:
            out = self._file if self._file is not None else (self._stream or sys.stdout)
            try:
                out.write(message + "\n")
                out.flush()
            except (OSError, ValueError):
                # A full disk or a closed stream must not take mail delivery down.
                pass

    log = debug = info = warn = warning = msg
    fatal = failure = err = error = critical = exception = msg

    # -- rotation ------------------------------------------------------------------------

    def reopen(self) -> bool:
        """Reopen ``maillog_file`` after rotation; True if reopened, False if no file.

        If the new file cannot be opened the old handle is kept (lines go to
        the rotated file rather than nowhere) and a warning says why.
        """
        if self.path is None:
            return False
        try:
            new = self._open(self.path)
        except OSError as exc:
            structlog.get_logger().bind(component="master").warning(
                "cannot reopen the log file", file=str(self.path), error=exc.strerror or str(exc)
            )
            return False
        with self._lock:
            old, self._file = self._file, new
        if old is not None:
            old.close()
        return True

    def close(self) -> None:
        """Close the file (lines written afterwards go to the stream)."""
        with self._lock:
            old, self._file = self._file, None
        if old is not None:
            old.close()


def configure_logging(
    log_format: LogFormat = "postfix",
    stream: TextIO | None = None,
    level: int = logging.INFO,
    *,
    maillog_file: str | os.PathLike[str] | None = None,
    hostname: str | None = None,
    program: str = "qmgrd",
    clock: Callable[[], float] = time.time,
) -> LogOutput:
    """Configure structlog for the process; called once by the CLI (the only global setup).

    Returns the output so the caller can ``reopen()`` the file on SIGHUP and
    ``close()`` it at exit. Raises ConfigError for an unknown format or a file
    that cannot be opened.
    """
    output = LogOutput(
        log_format,
        stream,
        maillog_file=maillog_file,
        hostname=hostname,
        program=program,
        clock=clock,
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.format_exc_info,
            output.render,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(level),
        logger_factory=output,
        cache_logger_on_first_use=False,
    )
    return output


def reopen_logs() -> bool:
    """Reopen the configured ``maillog_file`` (SIGHUP); False when logging to a stream."""
    factory = structlog.get_config().get("logger_factory")
    if isinstance(factory, LogOutput):
        return factory.reopen()
    return False


def get_logger(component: str) -> Any:
    """A logger bound to a component name (``smtpd``, ``qmgr``, ``smtp``, ...)."""
    return structlog.get_logger().bind(component=component)
