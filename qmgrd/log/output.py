"""The log output: where rendered lines go (journal, syslog, a stream or ``maillog_file``).

:class:`LogOutput` is structlog's final processor, logger factory and logger;
the destinations, the line shapes and the batching of ``maillog_file`` writes
are described in :mod:`qmgrd.log`'s module doc.
"""

from __future__ import annotations

import asyncio
import os
import socket
import sys
import threading
import time
import weakref
from collections.abc import Callable, Mapping, MutableMapping
from pathlib import Path
from typing import Any, Literal, TextIO

import structlog

from qmgrd.errors import ConfigError
from qmgrd.log.render import (
    escape,
    postfix_message,
    render_json,
    syslog_timestamp,
)
from qmgrd.log.sinks import (
    JOURNAL_SOCKET,
    SYSLOG_SOCKET,
    Destination,
    JournalSink,
    SyslogSink,
    choose_destination,
    priority_of,
)

LogFormat = Literal["postfix", "json"]

# structlog's add_log_level names: the method ``warn`` logs at warning, ``exception`` at error.
_LEVEL_NAMES = {"warn": "warning", "exception": "error"}


def syslog_name_problem(name: str) -> str | None:
    """Why ``name`` cannot be a syslog program name, or None if it can.

    Log tools split ``name/component[pid]:`` at ``/``, ``[`` and ``:`` and the
    syslog line at white space, so none of those may occur in it.
    """
    if not name:
        return "empty program name"
    bad = next((ch for ch in name if ch.isspace() or ch in "/[]:" or not ch.isprintable()), None)
    if bad is not None:
        return (
            f"contains {bad!r}; use a plain program name such as qmgrd or postfix-out "
            "(lines are tagged syslog_name/component)"
        )
    return None


def check_syslog_name(name: str) -> str:
    """``name`` if it can be a syslog program name, else ConfigError saying why."""
    problem = syslog_name_problem(name)
    if problem:
        raise ConfigError(f"syslog_name: {name!r}: {problem}")
    return name


class LogOutput:
    """Where rendered lines go: the journal, syslog, a stream, or a file that can be reopened.

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
        destination: Destination | None = None,
        environ: Mapping[str, str] | None = None,
        journal_socket: str = JOURNAL_SOCKET,
        syslog_socket: str = SYSLOG_SOCKET,
    ) -> None:
        """Opens ``maillog_file`` now (ConfigError if it cannot be opened).

        Without a file, ``destination`` None means: ``stream`` when one is
        given, else the module doc's choice for standard output (``environ``
        defaults to ``os.environ``).
        """
        if log_format not in ("postfix", "json"):
            raise ConfigError(f"log_format: unknown format {log_format!r}")
        check_syslog_name(program)
        self.log_format: LogFormat = log_format
        self.path = Path(maillog_file) if maillog_file else None
        self.hostname = hostname or socket.gethostname().split(".", 1)[0] or "localhost"
        self.program = program
        self.clock = clock
        self._stream = stream
        self._lock = threading.Lock()
        self._file: TextIO | None = None
        self._sink: JournalSink | SyslogSink | None = None
        self._pending: list[str] = []  # maillog_file lines not written yet
        self._flush_loop: asyncio.AbstractEventLoop | None = None  # where a flush is due
        self._flush_thread = 0  # the thread that loop was running on when the flush was due
        # A fork (a worker process) writes the queued lines first, so that the child
        # does not inherit and write them again; the child starts with no flush due.
        ref = weakref.ref(self)
        os.register_at_fork(
            before=lambda: _call(ref, LogOutput.flush_pending),
            after_in_child=lambda: _call(ref, LogOutput._forked),
        )
        # (second, its syslog time stamp, component -> line prefix): one tuple, replaced once a
        # second, so a line renders from one second's stamp and prefixes whatever thread logs.
        self._second: tuple[int, str, dict[str, str]] = (-1, "", {})
        self._pid = os.getpid()  # for each line's [pid]; a forked child sets its own
        if self.path is not None:
            destination = "stream"
            try:
                self._file = self._open(self.path)
            except OSError as exc:
                raise ConfigError(
                    f"maillog_file: cannot open {self.path}: {exc.strerror or exc}"
                ) from None
        elif destination is None:
            destination = (
                "stream"
                if stream is not None
                else choose_destination(
                    1,
                    os.environ if environ is None else environ,
                    journal_socket=journal_socket,
                    syslog_socket=syslog_socket,
                )
            )
        if destination == "journal":
            self._sink = JournalSink(journal_socket)
        elif destination == "syslog":
            self._sink = SyslogSink(syslog_socket)
        self.destination: Destination = destination

    def identifier(self, component: object) -> str:
        """``syslog_name/component`` (``qmgrd/smtpd``), or ``syslog_name`` without one."""
        return f"{self.program}/{escape(component)}" if component else self.program

    @staticmethod
    def _open(path: Path) -> TextIO:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o640)
        return open(fd, "a", buffering=1, encoding="utf-8", errors="backslashreplace", closefd=True)

    # -- structlog processor and logger -------------------------------------------------

    def render(
        self, _logger: Any, method: str, event_dict: MutableMapping[str, Any]
    ) -> str | tuple[tuple[str], dict[str, Any]]:
        """The final structlog processor: the line (prefixed in a file), or the message and
        the journal/syslog fields when a socket is the destination."""
        # structlog's add_log_level and format_exc_info, inlined: this runs for every line.
        event_dict["level"] = _LEVEL_NAMES.get(method, method)
        if "exc_info" in event_dict:
            event_dict = structlog.processors.format_exc_info(_logger, method, event_dict)
        now = self.clock()
        text = (
            render_json(event_dict, now)
            if self.log_format == "json"
            else postfix_message(event_dict)
        )
        return self.finish(
            text,
            event_dict.get("component"),
            str(event_dict.get("level", method)),
            event_dict.get("queue_id"),
            now,
        )

    def finish(
        self, text: str, component: object, level: str, queue_id: object, now: float
    ) -> str | tuple[tuple[str], dict[str, Any]]:
        """What ``render`` returns for the rendered ``text``: the line (prefixed in a file), or
        the message and the journal/syslog fields. :mod:`qmgrd.log.lines` shares it."""
        if self._sink is not None:
            meta = {
                "identifier": self.identifier(component),
                "priority": priority_of(level),
                "queue_id": escape(queue_id) if queue_id is not None else None,
            }
            return (text,), meta
        if self.path is None or self.log_format == "json":
            return text
        return self._prefix(component, now) + text

    def _prefix(self, component: object, now: float) -> str:
        """``stamp host name[pid]: ``, what a ``maillog_file`` line starts with."""
        second = int(now)
        state = self._second
        if state[0] != second:  # the time stamp changes once a second
            state = self._second = (second, syslog_timestamp(now), {})
        _, stamp, prefixes = state
        # The prefix of each component's lines is built once per second.
        prefix = prefixes.get(component) if type(component) is str else None
        if prefix is None:
            name = f"{self.program}/{escape(component)}" if component else self.program
            prefix = f"{stamp} {self.hostname} {name}[{self._pid}]: "
            if type(component) is str:
                prefixes[component] = prefix
        return prefix

    def write_info(self, text: str, component: object, queue_id: object, now: float) -> None:
        """``msg`` of ``finish(text, component, "info", queue_id, now)``: the tail of
        :mod:`qmgrd.log.lines`' lines, a ``maillog_file`` line in one call (and ``_file_line``)
        while its prefix is known for this second."""
        if self._sink is None and self.path is not None and self.log_format != "json":
            state = self._second
            prefix = (
                state[2].get(component)
                if state[0] == int(now) and type(component) is str
                else None
            )
            line = (prefix or self._prefix(component, now)) + text
            with self._lock:
                if self._file is not None:
                    self._file_line(line)
                    return
            self.msg(line)  # the file is closed: the stream, as msg does
            return
        result = self.finish(text, component, "info", queue_id, now)
        if isinstance(result, str):
            self.msg(result)
        else:
            args, meta = result
            self.msg(*args, **meta)

    def __call__(self, *_args: Any) -> LogOutput:
        """structlog's logger factory: every logger writes through this output."""
        return self

    def msg(
        self,
        message: str,
        *,
        identifier: str | None = None,
        priority: int = 6,
        queue_id: str | None = None,
    ) -> None:
        """Write one rendered line (to the journal or syslog when ``render`` gave fields)."""
        with self._lock:
            if self._sink is not None and identifier is not None:
                try:
                    self._sink.send(
                        message,
                        identifier=identifier,
                        pid=self._pid,
                        priority=priority,
                        queue_id=queue_id,
                    )
                    return
                except OSError:
                    pass  # journald restarting, syslog gone: the line goes to stdout
            if self._file is not None:
                self._file_line(message)
                return
            out = self._stream or sys.stdout
            try:
                out.write(message + "\n")
                out.flush()
            except (OSError, ValueError):
                # A full disk or a closed stream must not take mail delivery down.
                pass

    def _file_line(self, message: str) -> None:
        """Queue a line for ``maillog_file`` (lock held); see the module doc on batching."""
        self._pending.append(message)
        due = self._flush_loop
        if due is not None and self._flush_thread == threading.get_ident() and due.is_running():
            # This thread's loop has its flush due already: nothing to look up (on Python
            # 3.11 every get_running_loop is a getpid system call, and a pass logs many lines).
            return
        try:
            loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        if self._flush_loop is not None and self._flush_loop.is_closed():
            self._flush_loop = None  # its flush never ran: write what waits now
        if loop is not None:
            if self._flush_loop is loop:
                return  # this loop's flush is already due
            if self._flush_loop is None:
                self._flush_loop = loop
                self._flush_thread = threading.get_ident()
                loop.call_soon(self._flush)
                return
        self._write_pending()  # not on a loop: at once, after the lines queued before

    def _flush(self) -> None:
        """The loop's flush: every line queued since the last one, in one write."""
        with self._lock:
            self._flush_loop = None
            self._write_pending()

    def flush_pending(self) -> None:
        """Write the queued maillog_file lines now (before a fork)."""
        with self._lock:
            self._write_pending()

    def _forked(self) -> None:
        """In a forked child: a fresh lock, nothing queued, no flush due on the parent's loop."""
        self._lock = threading.Lock()
        self._pending.clear()
        self._flush_loop = None
        self._pid = os.getpid()
        self._second = (-1, "", {})  # the prefixes carry the parent's pid

    def _write_pending(self) -> None:
        """Write the queued lines to the file (lock held)."""
        if not self._pending or self._file is None:
            return
        text = "\n".join(self._pending) + "\n"
        self._pending.clear()
        try:
            self._file.write(text)
            self._file.flush()
        except (OSError, ValueError):
            # A full disk or a closed file must not take mail delivery down.
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
            self._write_pending()  # lines logged before the rotation go to the old file
            old, self._file = self._file, new
        if old is not None:
            old.close()
        return True

    def close(self) -> None:
        """Close the file or socket (lines written afterwards go to the stream)."""
        with self._lock:
            self._write_pending()
            old, self._file = self._file, None
            sink, self._sink = self._sink, None
        if old is not None:
            old.close()
        if sink is not None:
            sink.close()


def _call(ref: weakref.ReferenceType[LogOutput], method: Callable[[LogOutput], None]) -> None:
    output = ref()
    if output is not None:
        method(output)
