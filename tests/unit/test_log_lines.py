"""The direct log path (``qmgrd.log.lines.LineLog``) writes what structlog's path writes.

The rendered bytes are the subject here, so these tests compare text: each event is
logged once through ``get_logger(...).info`` and once through ``LineLog.info`` to the
same kind of output, in both formats and to every destination, and the two must match.
"""

from __future__ import annotations

import io
import logging
import re
import socket
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from qmgrd.log import LogFormat, configure_logging, get_logger
from qmgrd.log.lines import LineLog
from qmgrd.log.render import postfix_message
from qmgrd.log.session import CommandCounts
from tests.support.logs import saved_structlog, watch_logs

T0 = 1709647629.25
DESTINATIONS = ("file", "stream", "journal", "syslog")


@pytest.fixture(autouse=True)
def restore_structlog() -> Iterator[None]:
    """Each test configures logging globally; put the previous configuration back."""
    with saved_structlog():
        yield


def _sent_fields(**extra: Any) -> dict[str, Any]:
    """The queue manager's status=sent fields, in its call order."""
    fields: dict[str, Any] = {
        "queue_id": "4F9D3C2A1B0E7D6",
        "to": "<a@example.com>",
        "relay": "mx.example.com[192.0.2.1]:25",
        "transport": "smtp",
        "delay": "0.06",
        "delays": "0.01/0/0.02/0.03",
        "dsn": "2.0.0",
        "status": "sent",
        "reply": "250 2.0.0 Ok: queued as X",
    }
    fields.update(extra)
    return fields


class Target:
    """One configured output and a way to read what the last line wrote to it."""

    def __init__(self, tmp: Path, log_format: LogFormat, destination: str) -> None:
        self.destination = destination
        self.stream = io.StringIO()
        self.sock: socket.socket | None = None
        self.path = tmp / "maillog"
        self.path.unlink(missing_ok=True)
        kwargs: dict[str, Any] = {"clock": lambda: T0, "hostname": "mx"}
        if destination == "file":
            kwargs["maillog_file"] = self.path
        elif destination in ("journal", "syslog"):
            sock_path = tmp / f"{destination}.sock"
            sock_path.unlink(missing_ok=True)
            self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            self.sock.bind(str(sock_path))
            self.sock.settimeout(5)
            kwargs["destination"] = destination
            kwargs[f"{destination}_socket"] = str(sock_path)
        configure_logging(log_format, self.stream, **kwargs)
        self._seen = 0

    def take(self) -> bytes:
        """What arrived since the last call (a syslog line without its time stamp)."""
        if self.sock is not None:
            data = self.sock.recv(1 << 20)
            if self.destination == "syslog":  # the sink stamps with the wall clock
                data = re.sub(rb"^(<\d+>)\w{3} [ \d]\d \d\d:\d\d:\d\d ", rb"\1", data)
            return data
        if self.destination == "file":
            raw = self.path.read_bytes()
        else:
            raw = self.stream.getvalue().encode()
        out, self._seen = raw[self._seen :], len(raw)
        return out

    def __enter__(self) -> Target:
        return self

    def __exit__(self, *_exc: object) -> None:
        if self.sock is not None:
            self.sock.close()


# Hypothesis runs inside each parametrized test, on that test's output.
EXAMPLES = settings(
    max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


def _both(target: Target, component: str, event: str, fields: dict[str, Any]) -> None:
    """Log through both paths; assert the same bytes arrived, and that something did."""
    log = get_logger(component)
    log.info(event, **fields)
    expected = target.take()
    LineLog(log).info(event, **fields)
    assert target.take() == expected
    assert expected


# Mostly printable text (the direct path), sometimes anything (the renderer's escaping).
TEXT = st.one_of(
    st.text(st.characters(min_codepoint=32, max_codepoint=126), max_size=12),
    st.text(st.characters(codec="utf-8"), max_size=12),
)
VALUES = st.one_of(st.none(), TEXT, st.integers(-5, 10**6), st.sampled_from(["sent", "<a@b>"]))
KEYS = st.sampled_from(
    [
        "queue_id",
        "to",
        "orig_to",
        "relay",
        "transport",
        "delay",
        "delays",
        "dsn",
        "status",
        "reply",
        "client",
        "from_",
        "size",
        "nrcpt",
        "sasl_method",
        "message_id",
        "conn_use",
        "stage",
        "code",
        "reason",
        "after",
        "component",
        "level",
    ]
)
EVENTS = st.one_of(
    st.sampled_from(["sent", "removed", "queued", "connect", "cleanup", "NOQUEUE: reject"]),
    TEXT,
)


COUNT = st.one_of(
    st.tuples(st.integers(0, 3), st.integers(0, 3)),
    st.integers(0, 3),
    st.booleans(),
)
COMMAND_NAMES = st.one_of(
    st.sampled_from(["ehlo", "mail", "rcpt", "data", "quit"]), st.sampled_from(["unknown", "x"])
)
# (component, event, fields): anything, and disconnect lines with command counts.
CASES = st.one_of(
    st.tuples(
        st.sampled_from(["smtp", "qmgr", "smtpd"]),
        EVENTS,
        st.dictionaries(KEYS, VALUES, max_size=9),
    ),
    st.builds(
        lambda client, counts: ("smtpd", "disconnect", {"client": client, "commands": counts}),
        TEXT,
        st.dictionaries(COMMAND_NAMES, COUNT, max_size=5),
    ),
)


@pytest.mark.parametrize("destination", DESTINATIONS)
@pytest.mark.parametrize("log_format", ["postfix", "json"])
def test_random_events_match_the_structlog_path(
    tmp_path: Path, log_format: LogFormat, destination: str
) -> None:
    """Any event and fields (values from the network included) give the same bytes."""
    with Target(tmp_path, log_format, destination) as target:

        @EXAMPLES
        @given(case=CASES)
        def check(case: tuple[str, str, dict[str, Any]]) -> None:
            _both(target, *case)

        check()


# Counts equal to each other across types (True == 1 == 1.0): a LineLog's cache of
# disconnect texts must not give one for another where the renderer writes them apart.
EQUAL_NUMBERS = st.one_of(st.integers(0, 2), st.booleans(), st.sampled_from([0.0, 1.0]))
EQUAL_COUNTS = st.one_of(
    st.tuples(EQUAL_NUMBERS, EQUAL_NUMBERS), st.integers(0, 2), st.booleans()
)


@pytest.mark.parametrize("destination", DESTINATIONS)
def test_disconnect_lines_of_one_line_log_match_the_structlog_path(
    tmp_path: Path, destination: str
) -> None:
    """One LineLog, which keeps the count texts of earlier disconnect lines, writes each
    later line as structlog does, whatever equal counts of other types it is given."""
    with Target(tmp_path, "postfix", destination) as target:
        log = get_logger("smtpd")
        lines = LineLog(log)

        @EXAMPLES
        @given(many=st.lists(st.dictionaries(COMMAND_NAMES, EQUAL_COUNTS, max_size=5), max_size=6))
        def check(many: list[dict[str, Any]]) -> None:
            for counts in many:
                log.info("disconnect", client="c[1]", commands=counts)
                expected = target.take()
                lines.info("disconnect", client="c[1]", commands=counts)
                assert target.take() == expected

        check()


@pytest.mark.parametrize("destination", DESTINATIONS)
@pytest.mark.parametrize("log_format", ["postfix", "json"])
def test_the_hot_lines_match_the_structlog_path(
    tmp_path: Path, log_format: LogFormat, destination: str
) -> None:
    """Each line a relayed message writes (listener and queue manager) gives the same bytes."""
    counts = CommandCounts()
    for verb, ok in (("EHLO", True), ("MAIL", True), ("RCPT", False), ("QUIT", True)):
        counts.record(verb, ok=ok)
    qid = "4F9D3C2A1B0E7D6"
    unattempted = _sent_fields(relay="none", status="deferred", dsn="4.4.1")
    del unattempted["transport"]  # as Recorder.defer_unattempted logs it
    with Target(tmp_path, log_format, destination) as target:
        _both(target, "smtpd", "connect", {"client": "unknown[127.0.0.1]"})
        _both(
            target,
            "smtpd",
            "queued",
            {
                "queue_id": qid,
                "client": "unknown[127.0.0.1]",
                "from_": "<a@src>",
                "size": 1078,
                "nrcpt": 1,
                "sasl_method": None,
                "sasl_username": None,
            },
        )
        _both(target, "cleanup", "cleanup", {"queue_id": qid, "message_id": "<x@y>"})
        _both(target, "smtpd", "disconnect", {"client": "c[1]", "commands": counts.as_field()})
        _both(target, "qmgr", "queued", {"queue_id": qid, "from_": "<a>", "size": 9, "nrcpt": "1"})
        for status in ("sent", "deferred", "bounced"):
            _both(target, "smtp", status, _sent_fields(status=status))
        _both(target, "smtp", "deferred", unattempted)
        _both(target, "smtp", "sent", _sent_fields(reply="250 ok\r\nX-Injected: 1"))
        _both(target, "qmgr", "removed", {"queue_id": qid})


OUTCOME_NAMES = (
    "queue_id", "to", "relay", "transport", "delay", "delays", "dsn", "status", "reply"
)
OUTCOME_FIELDS = st.fixed_dictionaries({name: VALUES for name in OUTCOME_NAMES})


def _outcome_args(fields: dict[str, Any]) -> tuple[Any, ...]:
    """``LineLog.outcome``'s positional arguments for the recipient line ``fields``."""
    return tuple(fields[name] for name in OUTCOME_NAMES)


@pytest.mark.parametrize("destination", DESTINATIONS)
@pytest.mark.parametrize("log_format", ["postfix", "json"])
def test_outcome_writes_what_info_writes(
    tmp_path: Path, log_format: LogFormat, destination: str
) -> None:
    """``outcome(event, *values)`` gives the bytes of ``info(event, **fields)`` (and so of
    structlog's path), for any values: None, unprintable, numbers."""
    with Target(tmp_path, log_format, destination) as target:
        lines = LineLog(get_logger("smtp"))
        for status in ("sent", "deferred", "bounced"):
            fields = _sent_fields(status=status)
            lines.info(status, **fields)
            expected = target.take()
            lines.outcome(status, *_outcome_args(fields))
            assert target.take() == expected and expected

        @EXAMPLES
        @given(event=EVENTS, fields=OUTCOME_FIELDS)
        def check(event: str, fields: dict[str, Any]) -> None:
            fields = dict(zip(OUTCOME_NAMES, _outcome_args(fields), strict=True))  # call order
            lines.info(event, **fields)
            expected = target.take()
            lines.outcome(event, *_outcome_args(fields))
            assert target.take() == expected

        check()


def test_outcome_is_captured_as_info_is(tmp_path: Path) -> None:
    """Under watch_logs ``outcome`` hands the capture info's event, keys in the same order."""
    Target(tmp_path, "postfix", "stream")
    lines = LineLog(get_logger("smtp"))
    with watch_logs() as logs:
        lines.outcome("sent", *_outcome_args(_sent_fields()))
        lines.info("sent", **_sent_fields())
    assert logs[0] == logs[1]
    assert list(logs[0]) == list(logs[1])
    seen: list[tuple[str, dict[str, Any]]] = []

    class Fake:
        def info(self, event: str, **fields: Any) -> None:
            seen.append((event, fields))

    LineLog(Fake()).outcome("sent", *_outcome_args(_sent_fields()))
    assert seen == [("sent", _sent_fields())]


def test_the_recipient_line_has_postfix_order(tmp_path: Path) -> None:
    """The direct path's status=sent line is Postfix's shape, transport left out."""
    target = Target(tmp_path, "postfix", "stream")
    LineLog(get_logger("smtp")).info("sent", **_sent_fields())
    assert target.take() == (
        b"4F9D3C2A1B0E7D6: to=<a@example.com>, relay=mx.example.com[192.0.2.1]:25, "
        b"delay=0.06, delays=0.01/0/0.02/0.03, dsn=2.0.0, status=sent "
        b"(250 2.0.0 Ok: queued as X)\n"
    )


def test_hot_shapes_skip_the_general_renderer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Recipient, ``ID: event``, ``ID: k=v``, connect and disconnect lines never reach the
    general renderer; a shape it has no direct path for does."""
    target = Target(tmp_path, "postfix", "stream")
    calls: list[str] = []
    real: Callable[[Any], str] = postfix_message

    def counted(event_dict: Any) -> str:
        calls.append(str(event_dict["event"]))
        return real(event_dict)

    monkeypatch.setattr("qmgrd.log.lines.postfix_message", counted)
    lines = LineLog(get_logger("qmgr"))
    lines.info("sent", **_sent_fields())
    lines.info("removed", queue_id="4F1")
    lines.info("queued", queue_id="4F1", from_="<a>", size=3, nrcpt="1 (queue active)")
    lines.info("connect", client="unknown[127.0.0.1]")
    lines.info("disconnect", client="c[1]", commands={"quit": (1, 1), "rcpt": (0, 1)})
    assert calls == []
    lines.info("disconnect", client="c[1]", commands={"unknown": 1})
    assert calls == ["disconnect"]
    assert target.take().decode().splitlines()[1:] == [
        "4F1: removed",
        "4F1: from=<a>, size=3, nrcpt=1 (queue active)",
        "connect from unknown[127.0.0.1]",
        "disconnect from c[1] rcpt=0/1 quit=1 commands=1/2",
        "disconnect from c[1] unknown=1 commands=1",
    ]


def test_captured_logs_see_the_same_events(tmp_path: Path) -> None:
    """Under watch_logs the direct path hands events to the capture, then resumes writing."""
    target = Target(tmp_path, "postfix", "stream")
    log = get_logger("smtp")
    lines = LineLog(log)
    with watch_logs() as logs:
        lines.info("sent", **_sent_fields())
        log.info("sent", **_sent_fields())
    assert len(logs) == 2
    assert logs[0] == logs[1]
    assert logs[0]["to"] == "<a@example.com>"
    assert target.take() == b""  # captured, not written
    lines.info("removed", queue_id="4F1")
    assert target.take() == b"4F1: removed\n"


def test_a_filtered_level_writes_nothing(tmp_path: Path) -> None:
    """With log level warning, info lines are dropped on both paths."""
    stream = io.StringIO()
    configure_logging("postfix", stream, level=logging.WARNING)
    LineLog(get_logger("smtp")).info("sent", **_sent_fields())
    LineLog(get_logger("qmgr")).info("removed", queue_id="4F1")
    assert stream.getvalue() == ""


def test_a_logger_that_is_not_structlog_is_delegated_to() -> None:
    """Anything but a configured structlog logger just gets ``info`` called."""
    seen: list[tuple[str, dict[str, Any]]] = []

    class Fake:
        def info(self, event: str, **fields: Any) -> None:
            seen.append((event, fields))

    LineLog(Fake()).info("removed", queue_id="4F1")
    assert seen == [("removed", {"queue_id": "4F1"})]


def test_other_methods_are_the_loggers_and_wrapping_twice_is_once(tmp_path: Path) -> None:
    """A LineLog stands in for its logger: warning goes through structlog, info directly."""
    target = Target(tmp_path, "postfix", "stream")
    log = get_logger("qmgr")
    lines = LineLog(LineLog(log))
    assert lines.logger is log
    lines.warning("corrupt queue file", queue_id="4F1", reason="bad record")
    lines.info("removed", queue_id="4F1")
    assert target.take() == (b"warning: 4F1: corrupt queue file, reason=bad record\n4F1: removed\n")


def test_file_lines_across_seconds_and_after_close_match_the_structlog_path(
    tmp_path: Path,
) -> None:
    """A maillog_file line gets this second's prefix on both paths (the direct one keeps it
    per second), and once the file is closed both paths write to the stream."""
    now = [T0]
    stream = io.StringIO()
    path = tmp_path / "maillog"
    output = configure_logging(
        "postfix", stream, maillog_file=path, hostname="mx", clock=lambda: now[0]
    )
    log = get_logger("qmgr")
    lines = LineLog(log)
    for step in (0.0, 0.5, 1.0, 1.25, 60.0):
        now[0] = T0 + step
        log.info("removed", queue_id="4F1")
        lines.info("removed", queue_id="4F1")
        lines.outcome("sent", *_outcome_args(_sent_fields()))
        log.info("sent", **_sent_fields())
    output.flush_pending()
    written = path.read_text().splitlines()
    assert len(written) == 20
    for i in range(0, 20, 4):
        assert written[i] == written[i + 1] and written[i + 2] == written[i + 3]
    output.close()
    log.info("removed", queue_id="4F2")
    lines.info("removed", queue_id="4F2")
    lines.outcome("sent", *_outcome_args(_sent_fields()))
    log.info("sent", **_sent_fields())
    after = stream.getvalue().splitlines()
    assert len(after) == 4
    assert after[0] == after[1] and after[0].endswith(": 4F2: removed")
    assert after[2] == after[3] and ": 4F9D3C2A1B0E7D6: to=<a@example.com>, " in after[3]
