"""The notify channel between the queue manager and its listener workers: messages and counts.

Contract
--------
One ``socketpair`` per worker, newline-framed JSON arrays (one short line
per message; addresses never hold a newline, the listener refuses control
characters). Worker to queue manager:

=============================================  ===============================================
``["ready"]``                                  the worker listens (sd_notify waits for every one)
``["c", id, sender, addr, sasl|null, n]``      a durable commit to ``incoming/``: queue id,
                                               envelope sender, client address, SASL user,
                                               recipient count (``Committed``)
``["s", {name: n}, sessions]``                 intake counts since the last ``s`` (below) and
                                               the sessions in progress now
``["anvil", id, op, key, ...]``                per-client counts (``qmgrd.daemon.anvil``); the
                                               queue manager answers ``["anvil", id, count]``
``["load", cap, [n, ...], sum]``               every ``LOAD_INTERVAL`` seconds: the worker's
                                               learned session cap, and its event loop's lag
                                               samples since the last ``load`` per bucket of
                                               ``looplag.LAG_BUCKETS`` (+Inf last) and their
                                               sum (:class:`LoadReport`; exported per worker,
                                               ``metrics_intake.WorkerLoad``)
=============================================  ===============================================

Queue manager to worker: ``["hup", accepted]`` (SIGHUP: reopen the log file;
with ``accepted`` true also re-read the configuration, which the queue
manager has already checked and applied); the worker answers ``["hup-done"]``
once it has. ``["over", [key, ...]]``: the fair-admission flow keys now over
``qmgr_flow_backlog_limit`` (sent when the set changes and to a new worker).
``["backlog", over]``: whether the queue manager holds ``in_flow_backlog_limit``
messages or more (the regulator's capacity; same rule: on change and to a
new worker).

Intake metrics cross the channel as counts, not events: a worker's
:class:`CountingIntake` (the listener's ``IntakeObserver``) adds up its
events and sends the deltas at most every ``FLUSH_DELAY`` seconds (and at
stop); the queue manager adds them to its Prometheus series with
:func:`apply_counts`. Count names: ``connections``, ``messages``,
``recipients``, ``reject:<reason>``, ``auth:<mechanism>``, and the worker's
intake gate's counters ``inflow:paused``, ``inflow:timeout``,
``inflow:refused`` (``qmgrd.listener.inflow``; :func:`inflow_counts`).

``parse(line)`` returns the decoded array or raises ``ValueError`` for a
line that is not one (a bug in the worker: the queue manager logs it and
drops the line). Nothing here blocks; writes go to the stream's buffer.
``await read_commands(reader, handle, log, stop)`` is a worker's reading side
(listener and delivery workers): each message to ``handle`` until the
channel ends, then ``stop`` is set; a line that is not a message, or one
``handle`` refuses (``ValueError``, ``TypeError``, ``IndexError``), is logged
and skipped. ``await serve_commands(reader, handle, log, stop, send)`` says
``ready`` (``send``) and reads commands that way until ``stop`` is set.
``await close_channel(writer)`` sends what is buffered and closes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections import Counter
from collections.abc import Callable
from json.encoder import encode_basestring_ascii
from typing import Any

from qmgrd.daemon.looplag import LoopLag
from qmgrd.daemon.metrics_intake import AUTH_MECHANISMS, REJECT_REASONS, IntakeMetrics
from qmgrd.daemon.metrics_intake import reject_reason as _reject_reason
from qmgrd.listener.inflow import TokenGate
from qmgrd.listener.observer import Committed

__all__ = [
    "FLUSH_DELAY",
    "INFLOW_COUNTS",
    "LOAD_INTERVAL",
    "CountingIntake",
    "LoadReport",
    "apply_counts",
    "close_channel",
    "commit_from",
    "encode",
    "encode_commit",
    "inflow_counts",
    "parse",
    "read_commands",
    "serve_commands",
]

FLUSH_DELAY = 0.05  # seconds a worker's intake counts may wait before they are sent
LOAD_INTERVAL = 0.5  # seconds between a worker's load messages (session cap, loop lag)
INFLOW_COUNTS = ("paused", "timeout", "refused")  # a worker's TokenGate counters, in order


# json.dumps with these separators, minus the encoder it builds on every call.
_encode = json.JSONEncoder(separators=(",", ":")).encode
_quote = encode_basestring_ascii  # a JSON string, as json.dumps writes it (C)


def encode(*fields: Any) -> bytes:
    """One message: a JSON array on one line."""
    return _encode(fields).encode() + b"\n"


def encode_commit(c: Committed) -> bytes:
    """The ``c`` message of a commit: ``encode``'s very line, written field by field."""
    sasl = "null" if c.sasl_user is None else _quote(c.sasl_user)
    return (
        f'["c",{_quote(c.queue_id)},{_quote(c.sender)},{_quote(c.client_addr)},{sasl},'
        f"{int(c.recipients)}]\n"
    ).encode()


_decode = json.JSONDecoder().decode  # json.loads minus its per-call checks (bytes: detection)


def parse(line: bytes) -> list[Any]:
    """A message's fields (``ValueError`` for a line that is not a non-empty JSON array)."""
    value = _decode(line.decode())  # UTF-8 (encode writes ASCII); UnicodeDecodeError: ValueError
    if not isinstance(value, list) or not value or not isinstance(value[0], str):
        raise ValueError(f"not a notify message: {line[:80]!r}")
    return value


def commit_from(fields: list[Any]) -> Committed:
    """The ``Committed`` a ``c`` message carries (``ValueError`` if malformed)."""
    if len(fields) != 6:
        raise ValueError(f"bad commit message: {fields!r}")
    _, queue_id, sender, addr, sasl, count = fields
    if not (isinstance(queue_id, str) and isinstance(sender, str) and isinstance(addr, str)):
        raise ValueError(f"bad commit message: {fields!r}")
    if not (sasl is None or isinstance(sasl, str)) or not isinstance(count, int):
        raise ValueError(f"bad commit message: {fields!r}")
    return Committed(queue_id, sender, addr, sasl, count)


class CountingIntake:
    """A worker's ``IntakeObserver``: counts events and sends them as ``s`` messages."""

    __slots__ = ("_counts", "_gate_sent", "_handle", "_send", "gate", "sessions")

    def __init__(self, send: Callable[[bytes], None]) -> None:
        """``send`` writes one encoded message to the channel."""
        self._send = send
        self._counts: Counter[str] = Counter()
        self._handle: asyncio.TimerHandle | None = None
        self.sessions = 0
        self.gate: TokenGate | None = None  # the worker's intake gate: its counters ride along
        self._gate_sent = (0, 0, 0)  # paused, timeout, refused as last sent

    def _add(self, name: str, n: int = 1) -> None:
        self._counts[name] += n
        self._dirty()

    def _dirty(self) -> None:
        if self._handle is None:
            self._handle = asyncio.get_running_loop().call_later(FLUSH_DELAY, self.flush)

    def flush(self) -> None:
        """Send what was counted since the last flush (and the sessions in progress)."""
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        counts, self._counts = self._counts, Counter()
        if self.gate is not None:
            now = (self.gate.paused, self.gate.timeouts, self.gate.refused)
            for name, new, old in zip(INFLOW_COUNTS, now, self._gate_sent, strict=True):
                if new > old:
                    counts["inflow:" + name] = new - old
            self._gate_sent = now
        self._send(encode("s", dict(counts), self.sessions))

    def connected(self) -> None:
        """A connection was accepted."""
        self._add("connections")

    def rejected(self, reason: str) -> None:
        """A connection was refused before its session."""
        self._add("reject:" + reason)

    def session_started(self) -> None:
        """A session began."""
        self.sessions += 1
        self._dirty()

    def session_ended(self) -> None:
        """A session ended."""
        self.sessions -= 1
        self._dirty()

    def replied(self, text: str) -> None:
        """Count the reply line if it refuses something."""
        if text[:1] in ("4", "5"):
            reason = _reject_reason(text)
            if reason is not None:
                self._add("reject:" + reason)

    def message_accepted(self, recipients: int) -> None:
        """A message was queued."""
        self._counts["messages"] += 1
        self._add("recipients", max(0, recipients))

    def auth_failed(self, mechanism: str) -> None:
        """An AUTH exchange failed."""
        self._add("auth:" + mechanism.upper())


def inflow_counts(counts: object) -> dict[str, int]:
    """The ``inflow:`` counts of an ``s`` message (a worker's intake gate), by counter name."""
    if not isinstance(counts, dict):
        raise ValueError(f"bad intake counts: {counts!r}")
    out: dict[str, int] = {}
    for name, n in counts.items():
        kind, _, label = str(name).partition(":")
        if kind == "inflow" and label in INFLOW_COUNTS and isinstance(n, int) and n > 0:
            out[label] = n
    return out


def apply_counts(intake: IntakeMetrics, counts: object) -> None:
    """Add a worker's ``s`` counts to the queue manager's intake series (unknown names: other)."""
    if not isinstance(counts, dict):
        raise ValueError(f"bad intake counts: {counts!r}")
    for name, n in counts.items():
        if not isinstance(name, str) or not isinstance(n, int) or n < 0:
            raise ValueError(f"bad intake count: {name!r}={n!r}")
        kind, _, label = name.partition(":")
        if kind == "connections":
            intake.connections.inc(n)
        elif kind == "messages":
            intake.messages.inc(n)
        elif kind == "recipients":
            intake.recipients.inc(n)
        elif kind == "reject":
            intake.rejects.labels(label if label in REJECT_REASONS else "other").inc(n)
        elif kind == "auth":
            intake.auth_failures.labels(label if label in AUTH_MECHANISMS else "other").inc(n)


async def read_commands(
    reader: asyncio.StreamReader,
    handle: Callable[[list[Any]], None],
    log: Any,
    stop: asyncio.Event,
) -> None:
    """The queue manager's messages to ``handle`` until the channel ends (module doc)."""
    try:
        while line := await reader.readline():
            try:
                handle(parse(line))
            except (ValueError, TypeError, IndexError) as exc:
                log.error("bad message from the queue manager", error=str(exc))
    except ConnectionError:
        pass
    except ValueError as exc:  # a line over the stream's limit
        log.error("channel to the queue manager failed", error=str(exc))
    stop.set()


async def serve_commands(
    reader: asyncio.StreamReader,
    handle: Callable[[list[Any]], None],
    log: Any,
    stop: asyncio.Event,
    send: Callable[[bytes], None],
) -> None:
    """Say ``ready``, then handle commands until ``stop`` is set (module doc)."""
    send(encode("ready"))
    commands = asyncio.get_running_loop().create_task(read_commands(reader, handle, log, stop))
    try:
        await stop.wait()
    finally:
        commands.cancel()


async def close_channel(writer: asyncio.StreamWriter) -> None:
    """Send what is buffered (unless the queue manager is gone), then close."""
    with contextlib.suppress(ConnectionError):
        await writer.drain()
    writer.close()


class LoadReport:
    """A worker's ``load`` messages: its session cap and its loop lag's new samples."""

    __slots__ = ("_cap", "_lag", "_sent", "_sent_total")

    def __init__(self, lag: LoopLag, cap: Callable[[], int]) -> None:
        """``lag``: the worker's loop lag; ``cap``: its learned session cap now."""
        self._lag = lag
        self._cap = cap
        self._sent = [0] * len(lag.buckets)
        self._sent_total = 0.0

    def message(self) -> bytes:
        """The next ``load`` message (the lag samples since the previous one)."""
        now = list(self._lag.buckets)
        deltas = [new - old for new, old in zip(now, self._sent, strict=True)]
        total = self._lag.total
        self._sent, self._sent_total, added = now, total, total - self._sent_total
        return encode("load", self._cap(), deltas, round(added, 6))
