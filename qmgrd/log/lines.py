"""A direct path for hot log lines: the same bytes as structlog's, without its pipeline.

Contract
--------
``LineLog(log)`` wraps a logger from :func:`qmgrd.log.get_logger`;
``LineLog.info(event, **fields)`` writes exactly what ``log.info(event,
**fields)`` writes (same text in both ``log_format`` values, same bytes to
``maillog_file``, a stream, the journal and syslog, same level filtering), at
a fraction of the CPU. Call sites change ``log.info(...)`` to
``lines.info(...)`` and nothing else (the queue manager's recipient lines call
``lines.outcome(event, queue_id, to, relay, transport, delay, delays, dsn, status,
reply)``, the same line without the keywords); create the ``LineLog`` once (per
process or per long-lived object: construction looks at the logger) and reuse
it. Every other method (``warning``, ``error``, ``bind``, ...) is the wrapped
logger's, so a ``LineLog`` can stand wherever the logger stood (a context's
``log`` field), and ``LineLog(LineLog(log))`` wraps ``log`` once::

    lines = LineLog(get_logger("smtp"))
    lines.info("sent", queue_id=qid, to="<a@b>", relay=relay, delay="0.05",
               delays="0/0/0/0.04", dsn="2.0.0", status="sent", reply="250 Ok")

Theory of operation
-------------------
structlog spends ~3 µs per line in its bound-logger machinery (context copy,
processor chain, result dispatch) and :func:`qmgrd.log.render.render_postfix`
~4 µs more on the general shapes; a relayed message logs 5-7 lines plus one per
recipient. :meth:`LineLog.info` skips both for the shapes the busy paths log:

- a recipient outcome (``to`` and ``status``, only Postfix's recipient fields
  plus ``transport``), built in Postfix's field order;
- ``ID: event`` with no fields (``removed``), ``ID: k=v, k=v`` (``queued``,
  ``client=``, ``message_id=``, ...), in the caller's order, ``None`` dropped;
- ``connect from CLIENT`` and ``disconnect from CLIENT ehlo=1 ... commands=N``
  (Postfix's own command names, counts as ``CommandCounts.as_field`` gives them);

and hands anything else (rejects, SASL, ``lost connection``, ...) to the structlog
renderer's own functions, still without structlog. Escaping is checked once
per line: :func:`qmgrd.log.render.escape` changes a value only when it is not
printable, and a line built from raw values is printable exactly when every
value is, so a line that is not goes through the full renderer. The JSON format
builds the event dict structlog would (context, fields in call order, event,
level) and renders it with :func:`qmgrd.log.render.render_json`. The tail (syslog
prefix, journal fields, where the line goes) is :meth:`LogOutput.write_info`: what
:meth:`LogOutput.finish` and :meth:`LogOutput.msg`, structlog's path, do.

The direct path is taken only while the logger's processor chain is exactly
``[LogOutput.render]`` of the output it writes to and the logger's context is
only ``component``; otherwise (tests' ``capture_logs``/``watch_logs``, which
swap the configured processors in place, another configuration, a fake
logger) every call goes to ``log.info`` unchanged. The chain is looked at on
every call, so a capture that starts or ends later is honoured.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import structlog

from qmgrd.log.output import LogOutput
from qmgrd.log.render import POSTFIX_COMMAND_ORDER, postfix_message, render_json

__all__ = ["LineLog"]

# Keys the generic renderer treats specially: such a line takes the full renderer.
_SPECIAL = frozenset(
    {"event", "level", "timestamp", "component", "logger", "reply", "status", "to", "exc_info"}
)
# Fields a recipient outcome may carry for the direct path, and Postfix's order of them.
_RECIPIENT_FIELDS = frozenset(
    {"queue_id", "to", "orig_to", "relay", "conn_use", "delay", "delays", "dsn", "status"}
    | {"reply", "transport"}
)
_RECIPIENT_ORDER = ("to", "orig_to", "relay", "conn_use", "delay", "delays", "dsn")
_COMMANDS = frozenset(POSTFIX_COMMAND_ORDER)
_COMMAND_RANK = {name: rank for rank, name in enumerate(POSTFIX_COMMAND_ORDER)}.__getitem__
_TAILS = 64  # disconnect lines' count texts a LineLog keeps (_disconnect_line)


# The queue manager's recipient lines carry exactly these (``transport`` only in JSON).
_OUTCOME_KEYS = frozenset(
    {"queue_id", "to", "relay", "transport", "delay", "delays", "dsn", "status", "reply"}
)
_OUTCOME_KEYS_BARE = _OUTCOME_KEYS - {"transport"}


def _outcome_line(f: dict[str, Any]) -> str | None:
    """A recipient line with the queue manager's own fields: one format, no lookups by name."""
    return _outcome_text(
        f["queue_id"], f["to"], f["relay"], f["delay"], f["delays"], f["dsn"], f["status"],
        f["reply"],
    )


def _outcome_text(
    qid: object, to: object, relay: object, delay: object, delays: object, dsn: object,
    status: object, reply: object,
) -> str | None:
    """``_outcome_line`` of the values (None: not this shape, or not printable).

    ``{v!s}`` is ``str(v)``, as :func:`qmgrd.log.render.escape` spells a value.
    """
    if to is None or relay is None or delay is None or delays is None or dsn is None:
        return None
    if status is None:
        return None
    if reply is None:
        line = (
            f"{qid!s}: to={to!s}, relay={relay!s}, delay={delay!s}, delays={delays!s}, "
            f"dsn={dsn!s}, status={status!s}"
        )
    else:
        line = (
            f"{qid!s}: to={to!s}, relay={relay!s}, delay={delay!s}, delays={delays!s}, "
            f"dsn={dsn!s}, status={status!s} ({reply!s})"
        )
    return line if line.isprintable() else None


def _recipient_line(queue_id: object, fields: dict[str, Any]) -> str | None:
    """Any recipient line with only Postfix's recipient fields (and ``transport``)."""
    for key in fields:
        if key not in _RECIPIENT_FIELDS:
            return None
    get = fields.get
    status = get("status")
    if status is None or get("to") is None:
        return None
    parts = []
    for name in _RECIPIENT_ORDER:
        value = get(name)
        if value is not None:
            parts.append(f"{name}={value!s}")
    reply = get("reply")
    parts.append(f"status={status!s}" if reply is None else f"status={status!s} ({reply!s})")
    line = f"{queue_id!s}: " + ", ".join(parts)
    return line if line.isprintable() else None


def _disconnect_line(client: object, counts: object, tails: dict[Any, str]) -> str | None:
    """``disconnect from c[a] ehlo=1 ... commands=N`` when every count is Postfix's own
    command with an int or an (ok, total) pair of ints (``CommandCounts.as_field``).

    Theory of operation: sessions mostly end with the same few counts, so the text after
    the client is kept in ``tails`` (the caller's, bounded) by the counts' items, for
    counts that are all pairs. Another dict with equal items has pairs equal to those
    ints (a pair equals only a pair): ints, or bools or floats that the renderer writes
    as the same ints (``render._count_text``), so the line is what it would have been.
    """
    if type(counts) is not dict or not counts.keys() <= _COMMANDS:
        return None
    key = tuple(counts.items())
    try:
        tail = tails.get(key)
    except TypeError:  # an unhashable count: not one this path takes
        return None
    if tail is None:
        text = _counts_text(counts)
        if text is None:
            return None
        tail, pairs = text
        if pairs:
            if len(tails) >= _TAILS:
                tails.clear()
            tails[key] = tail
    line = f"disconnect from {client!s} {tail}"
    return line if line.isprintable() else None


def _counts_text(counts: dict[str, Any]) -> tuple[str, bool] | None:
    """``ehlo=1 ... commands=N`` (``_disconnect_line``) and whether every count was a pair;
    None for a count this path does not take."""
    parts = []
    all_ok = all_total = 0
    pairs = True
    for name in sorted(counts, key=_COMMAND_RANK):  # the few given, in Postfix's order
        count = counts[name]
        if type(count) is int:
            ok = total = count
            pairs = False
        elif type(count) is tuple and len(count) == 2:
            ok, total = count
            if type(ok) is not int or type(total) is not int:
                return None
        else:
            return None
        if total == 0:
            continue
        all_ok += ok
        all_total += total
        parts.append(f"{name}={ok}" if ok == total else f"{name}={ok}/{total}")
    parts.append(f"commands={all_ok}" if all_ok == all_total else f"commands={all_ok}/{all_total}")
    return " ".join(parts), pairs


def _postfix_line(event: str, fields: dict[str, Any], tails: dict[Any, str]) -> str | None:
    """The Postfix text of an info event for the direct shapes (module doc), or None
    (``tails``: the disconnect lines' cache, ``_disconnect_line``)."""
    queue_id = fields.get("queue_id")
    if queue_id is None:
        client = fields.get("client")
        if client is None:
            return None
        if event == "connect" and len(fields) == 1:
            line = f"connect from {client!s}"
            return line if line.isprintable() else None
        if event == "disconnect" and len(fields) == 2 and "commands" in fields:
            return _disconnect_line(client, fields["commands"], tails)
        return None
    if event == "NOQUEUE: reject":
        return None
    if "to" in fields or "status" in fields:
        keys = fields.keys()
        if keys in (_OUTCOME_KEYS, _OUTCOME_KEYS_BARE):
            return _outcome_line(fields)
        return _recipient_line(queue_id, fields)
    parts = []
    for key, value in fields.items():
        if value is None or key == "queue_id":
            continue
        if key in _SPECIAL:
            return None
        parts.append(f"{key[:-1] if key.endswith('_') else key}={value!s}")
    if not parts:
        line = f"{queue_id!s}: {event}"
    elif event and not event.isidentifier():
        line = f"{queue_id!s}: {event}, " + ", ".join(parts)
    else:
        line = f"{queue_id!s}: " + ", ".join(parts)
    return line if line.isprintable() and event.isprintable() else None


class LineLog:
    """``info`` lines of one logger through the direct path (module doc).

    ``info`` is the bound method of a :class:`_Lines` that holds the state: a type
    with ``__getattr__`` (this one, for the delegation) gets no specialised attribute
    lookups, and ``info`` reads its state on every line.
    """

    __slots__ = ("_log", "info", "outcome")

    def __init__(self, log: Any) -> None:
        """``log``: a bound logger from ``get_logger`` (anything else is only delegated to)."""
        if isinstance(log, LineLog):
            log = log.logger
        self._log: Any = log
        lines = _Lines(log)
        self.info: Callable[..., None] = lines.info
        # outcome(event, queue_id, to, relay, transport, delay, delays, dsn, status, reply)
        self.outcome: Callable[..., None] = lines.outcome

    def __getattr__(self, name: str) -> Any:
        """Every other method (``warning``, ``error``, ``bind``, ...) is the logger's own."""
        if name.startswith("_"):  # never the slots themselves (copy, pickle: no recursion)
            raise AttributeError(name)
        return getattr(self._log, name)

    @property
    def logger(self) -> Any:
        """The wrapped structlog logger."""
        return self._log


class _Lines:
    """A :class:`LineLog`'s state and its ``info`` (module doc)."""

    __slots__ = (
        "_component",
        "_context",
        "_enabled",
        "_log",
        "_output",
        "_procs",
        "_render",
        "_tails",
    )

    def __init__(self, log: Any) -> None:
        self._log: Any = log
        self._tails: dict[Any, str] = {}  # the disconnect lines' count texts (_disconnect_line)
        self._output: LogOutput | None = None
        self._render: Any = None
        procs = getattr(log, "_processors", None)
        context = structlog.get_context(log) if hasattr(log, "_context") else None
        direct = (
            isinstance(procs, list)
            and isinstance(getattr(log, "_logger", None), LogOutput)
            and context is not None
            and context.keys() <= {"component"}
        )
        # The list bound loggers share with structlog's configuration (changed in place by
        # capture_logs); None: never the direct path.
        self._procs: list[Any] | None = procs if direct else None
        self._context: dict[str, Any] = dict(context) if context is not None else {}
        self._component = self._context.get("component")
        is_enabled = getattr(log, "is_enabled_for", None)
        self._enabled = bool(is_enabled(logging.INFO)) if callable(is_enabled) else True

    def _direct(self) -> LogOutput | None:
        """The output to write to directly, or None while another chain is configured."""
        procs = self._procs
        if procs is None or len(procs) != 1:
            return None
        render = procs[0]
        if render is self._render:
            return self._output
        output = getattr(render, "__self__", None)
        if (
            output is self._log._logger
            and isinstance(output, LogOutput)
            and getattr(render, "__func__", None) is LogOutput.render
        ):
            self._render, self._output = render, output
            return output
        return None

    def info(self, event: str, /, **fields: Any) -> None:
        """Write what ``log.info(event, **fields)`` writes (module doc)."""
        if not self._enabled:
            return
        procs = self._procs
        if procs is not None and len(procs) == 1 and procs[0] is self._render:
            output = self._output
        else:
            output = self._direct()
        if output is None or "exc_info" in fields or "component" in fields:
            self._log.info(event, **fields)  # structlog's path (a component field renames)
            return
        now = output.clock()
        text = None if output.log_format == "json" else _postfix_line(event, fields, self._tails)
        if text is None:
            event_dict = dict(self._context)
            event_dict.update(fields)
            event_dict["event"] = event
            event_dict["level"] = "info"
            if output.log_format == "json":
                text = render_json(event_dict, now)
            else:
                text = postfix_message(event_dict)
        output.write_info(text, self._component, fields.get("queue_id"), now)

    def outcome(
        self, event: str, queue_id: object, to: object, relay: object, transport: object,
        delay: object, delays: object, dsn: object, status: object, reply: object, /,
    ) -> None:
        """``info(event, queue_id=queue_id, to=to, relay=relay, transport=transport,
        delay=delay, delays=delays, dsn=dsn, status=status, reply=reply)``, the queue
        manager's recipient line, without a dict of keywords and its key checks when the
        Postfix text is written directly; the same bytes (``info``'s own path otherwise)."""
        if self._enabled and queue_id is not None and event != "NOQUEUE: reject":
            procs = self._procs
            if procs is not None and len(procs) == 1 and procs[0] is self._render:
                output = self._output
            else:
                output = self._direct()
            if output is not None and output.log_format != "json":
                text = _outcome_text(queue_id, to, relay, delay, delays, dsn, status, reply)
                if text is not None:
                    output.write_info(text, self._component, queue_id, output.clock())
                    return
        self.info(
            event, queue_id=queue_id, to=to, relay=relay, transport=transport, delay=delay,
            delays=delays, dsn=dsn, status=status, reply=reply,
        )
