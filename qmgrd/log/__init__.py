"""Logging: structlog events rendered as Postfix-shaped lines or JSON, to the journal,
syslog, a file or standard output.

Every component logs structured events with fixed field names (STYLE §12)
through :func:`get_logger`; tests capture the events with
``structlog.testing.capture_logs`` instead of parsing text.
:mod:`qmgrd.log.render` turns an event into the text Postfix log tools
expect (its module doc lists the shapes and the fields each needs)::

    3F9A2B: to=<a@example.com>, relay=mx[127.0.0.1]:25, ..., status=sent (250 ok)

Hot lines
---------
:class:`qmgrd.log.lines.LineLog` wraps a logger for the lines a busy relay
writes per message and per recipient (``status=sent``, ``removed``,
``connect``, ``client=``, ...): ``LineLog(log).info(event, **fields)`` writes
the same bytes as ``log.info(event, **fields)`` in both formats and to every
destination, without structlog's pipeline and, for the fixed shapes, without
the general renderer. Under ``capture_logs`` it hands events to structlog.

Destinations
------------
:func:`configure_logging` is the process's one global logging setup (the
CLI calls it once). It returns a :class:`LogOutput`. Each line carries the
program identifier ``<syslog_name>/<component>`` (``qmgrd/smtpd``,
``qmgrd/qmgr``, ``qmgrd/smtp``, ...; ``syslog_name`` defaults to ``qmgrd``)
wherever the destination has room for it:

- ``maillog_file``: lines are appended to that file, each with the syslog
  prefix ``Mon DD HH:MM:SS host qmgrd/<component>[pid]: `` (local time, as
  syslog and Postfix's ``postlogd`` write it). ``/dev/stdout`` is a valid file
  name (Postfix's container convention). JSON lines are never prefixed: each
  line stays one JSON object. Lines logged on a running event loop are written
  together at the loop's next pass (``call_soon``), in order, with one write:
  a busy daemon logs several lines per pass, and every write on the loop
  thread is a system call that hands the interpreter lock to a waiting worker
  thread. A line logged off the loop (a worker thread, start-up) is written at
  once, after any lines still queued; ``reopen`` and ``close`` write what is
  queued first. Only a SIGKILL in the middle of a pass can lose that pass's
  lines.
- no ``maillog_file``: :func:`qmgrd.log.sinks.choose_destination` picks the
  systemd journal (native protocol, ``SYSLOG_IDENTIFIER=qmgrd/<component>``)
  when standard output is the journal, the syslog socket ``/dev/log`` when
  standard output is closed or ``/dev/null``, else standard output (plain
  lines: a terminal, a container, a test). A journal or syslog send that
  fails writes the line to standard output instead.

``LogOutput.reopen()`` (or :func:`reopen_logs`, which finds the configured
output through structlog's configuration) closes and reopens the file for
log rotation; the daemon calls it on SIGHUP.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Mapping
from typing import Any, TextIO

import structlog

from qmgrd.log.lines import LineLog
from qmgrd.log.output import LogFormat, LogOutput, check_syslog_name, syslog_name_problem
from qmgrd.log.render import escape, render_json, render_postfix, syslog_prefix
from qmgrd.log.sinks import JOURNAL_SOCKET, SYSLOG_SOCKET, Destination

__all__ = [
    "LineLog",
    "LogFormat",
    "LogOutput",
    "check_syslog_name",
    "configure_logging",
    "escape",
    "get_logger",
    "render_json",
    "render_postfix",
    "reopen_logs",
    "syslog_name_problem",
    "syslog_prefix",
]


def configure_logging(
    log_format: LogFormat = "postfix",
    stream: TextIO | None = None,
    level: int = logging.INFO,
    *,
    maillog_file: str | os.PathLike[str] | None = None,
    hostname: str | None = None,
    program: str = "qmgrd",
    clock: Callable[[], float] = time.time,
    destination: Destination | None = None,
    environ: Mapping[str, str] | None = None,
    journal_socket: str = JOURNAL_SOCKET,
    syslog_socket: str = SYSLOG_SOCKET,
) -> LogOutput:
    """Configure structlog for the process; called once by the CLI (the only global setup).

    ``program`` is ``syslog_name``. Returns the output so the caller can
    ``reopen()`` the file on SIGHUP and ``close()`` it at exit. Raises
    ConfigError for an unknown format, a bad ``syslog_name`` or a file that
    cannot be opened.
    """
    output = LogOutput(
        log_format,
        stream,
        maillog_file=maillog_file,
        hostname=hostname,
        program=program,
        clock=clock,
        destination=destination,
        environ=environ,
        journal_socket=journal_socket,
        syslog_socket=syslog_socket,
    )
    structlog.configure(
        # One processor: ``render`` adds the level and formats exc_info itself (every line
        # pays for each processor in the chain). No component binds context variables.
        processors=[output.render],
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
