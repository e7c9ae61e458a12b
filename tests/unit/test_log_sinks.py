"""Log destinations: the journal's native protocol, the syslog socket, and how one is chosen.

Each test binds its own Unix datagram socket in a temporary directory and points the
logger at it, then decodes what arrived as journald or a syslog daemon would.
"""

from __future__ import annotations

import array
import os
import socket
import struct
from collections.abc import Iterator
from pathlib import Path

import pytest

from qmgrd.errors import ConfigError
from qmgrd.log import LogOutput, configure_logging, get_logger
from qmgrd.log.sinks import JournalSink, choose_destination, journal_entry, stream_is_journal
from tests.support.logs import saved_structlog

T0 = 1709647629.25


@pytest.fixture(autouse=True)
def restore_structlog() -> Iterator[None]:
    """Each test configures logging globally; put the previous configuration back."""
    with saved_structlog():
        yield


@pytest.fixture
def receiver(tmp_path: Path) -> Iterator[tuple[socket.socket, str]]:
    """A bound Unix datagram socket standing in for journald or syslogd."""
    path = str(tmp_path / "sock")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(path)
    sock.settimeout(5)
    try:
        yield sock, path
    finally:
        sock.close()


def parse_journal(data: bytes) -> dict[str, str]:
    """Decode one native-protocol entry (both the NAME=value and the binary-length forms)."""
    fields: dict[str, str] = {}
    pos = 0
    while pos < len(data):
        newline = data.index(b"\n", pos)
        line = data[pos:newline]
        if b"=" in line:
            name, _, value = line.partition(b"=")
            fields[name.decode()] = value.decode()
            pos = newline + 1
        else:
            (size,) = struct.unpack("<Q", data[newline + 1 : newline + 9])
            start = newline + 9
            fields[line.decode()] = data[start : start + size].decode()
            assert data[start + size : start + size + 1] == b"\n"
            pos = start + size + 1
    return fields


def _journal(path: str) -> LogOutput:
    return configure_logging(
        "postfix", destination="journal", journal_socket=path, clock=lambda: T0
    )


def test_journal_entry_carries_postfix_identifier_pid_and_priority(
    receiver: tuple[socket.socket, str],
) -> None:
    """A journal entry has SYSLOG_IDENTIFIER=qmgrd/<component>, the pid, mail facility, level."""
    sock, path = receiver
    _journal(path)
    get_logger("smtp").info(
        "sent",
        queue_id="4F9D3C2A1B0E7D6",
        to="<a@example.com>",
        relay="mx[192.0.2.1]:25",
        delay="0.5",
        dsn="2.0.0",
        status="sent",
        reply="250 ok",
    )
    fields = parse_journal(sock.recv(65536))
    assert fields == {
        "MESSAGE": "4F9D3C2A1B0E7D6: to=<a@example.com>, relay=mx[192.0.2.1]:25, delay=0.5, "
        "dsn=2.0.0, status=sent (250 ok)",
        "PRIORITY": "6",
        "SYSLOG_FACILITY": "2",
        "SYSLOG_IDENTIFIER": "qmgrd/smtp",
        "SYSLOG_PID": str(os.getpid()),
        "QUEUE_ID": "4F9D3C2A1B0E7D6",
    }


def test_journal_warning_priority_and_syslog_name(receiver: tuple[socket.socket, str]) -> None:
    """syslog_name replaces qmgrd in the identifier; a warning has priority 4 and its prefix."""
    sock, path = receiver
    configure_logging(
        "postfix", destination="journal", journal_socket=path, program="postfix-out"
    )
    get_logger("smtpd").warning(
        "SASL authentication failed", client="unknown[127.0.0.2]", sasl_method="LOGIN"
    )
    fields = parse_journal(sock.recv(65536))
    assert fields["SYSLOG_IDENTIFIER"] == "postfix-out/smtpd"
    assert fields["PRIORITY"] == "4"
    assert fields["MESSAGE"].startswith("warning: unknown[127.0.0.2]: SASL LOGIN authentication")
    assert "QUEUE_ID" not in fields


def test_journal_value_with_newline_uses_the_binary_form() -> None:
    """A value containing a newline is sent length-prefixed, so it cannot forge a field."""
    data = journal_entry("one\nPRIORITY=0", identifier="qmgrd/qmgr", pid=7, priority=6)
    assert data.startswith(b"MESSAGE\n" + struct.pack("<Q", 14) + b"one\nPRIORITY=0\n")
    assert parse_journal(data)["PRIORITY"] == "6"


def test_journal_entry_too_large_for_a_datagram_goes_in_a_sealed_memfd(
    receiver: tuple[socket.socket, str],
) -> None:
    """An entry above the datagram limit arrives as a file descriptor holding the whole entry."""
    sock, path = receiver
    sink = JournalSink(path, datagram_limit=1024)
    big = "x" * 4096
    sink.send(f"big: detail={big}", identifier="qmgrd/qmgr", pid=1, priority=6)
    sink.close()
    fds = array.array("i")
    msg, ancdata, _flags, _addr = sock.recvmsg(16, socket.CMSG_LEN(fds.itemsize))
    assert msg == b""
    level, kind, payload = ancdata[0]
    assert (level, kind) == (socket.SOL_SOCKET, socket.SCM_RIGHTS)
    fds.frombytes(payload[: fds.itemsize])
    try:  # journald reads the file from offset 0 (mmap); the shared offset is at its end
        fields = parse_journal(os.pread(fds[0], os.fstat(fds[0]).st_size, 0))
    finally:
        os.close(fds[0])
    assert fields["MESSAGE"] == f"big: detail={big}"
    assert fields["SYSLOG_IDENTIFIER"] == "qmgrd/qmgr"


def test_journal_gone_falls_back_to_stdout(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """When journald cannot be reached the line is written to standard output, not lost."""
    configure_logging("postfix", destination="journal", journal_socket=str(tmp_path / "none"))
    get_logger("qmgr").info("removed", queue_id="ABC")
    assert capsys.readouterr().out == "ABC: removed\n"


def test_syslog_line_is_rfc3164_with_mail_facility(receiver: tuple[socket.socket, str]) -> None:
    """To /dev/log: <PRI>timestamp qmgrd/<component>[pid]: message, PRI = mail*8 + severity."""
    sock, path = receiver
    configure_logging("postfix", destination="syslog", syslog_socket=path)
    get_logger("smtpd").error("cannot write the queue file", client="unknown[127.0.0.1]")
    line = sock.recv(65536).decode()
    assert line.startswith("<19>")  # 2 * 8 + 3 (error)
    stamp, _, rest = line[4:].partition(" qmgrd/")
    assert len(stamp) == len("Mar  5 14:07:09")
    assert rest == (
        f"smtpd[{os.getpid()}]: error: cannot write the queue file: client=unknown[127.0.0.1]"
    )


def test_json_format_goes_to_the_journal_as_the_message(
    receiver: tuple[socket.socket, str],
) -> None:
    """With log_format json the journal MESSAGE is the JSON object; the identifier is kept."""
    sock, path = receiver
    configure_logging("json", destination="journal", journal_socket=path, clock=lambda: T0)
    get_logger("qmgr").info("removed", queue_id="ABC")
    fields = parse_journal(sock.recv(65536))
    assert fields["MESSAGE"].startswith('{"timestamp": "2024-03-05T14:07:09.250000Z"')
    assert fields["SYSLOG_IDENTIFIER"] == "qmgrd/qmgr"


def test_journal_stream_is_recognised_by_device_and_inode(tmp_path: Path) -> None:
    """JOURNAL_STREAM names the fd's device:inode only when systemd connected it."""
    with open(tmp_path / "out", "w") as f:
        st = os.fstat(f.fileno())
        assert stream_is_journal(f.fileno(), {"JOURNAL_STREAM": f"{st.st_dev}:{st.st_ino}"})
        assert not stream_is_journal(f.fileno(), {"JOURNAL_STREAM": f"{st.st_dev}:1"})
        assert not stream_is_journal(f.fileno(), {"JOURNAL_STREAM": "garbage"})
        assert not stream_is_journal(f.fileno(), {})


def test_choose_destination(tmp_path: Path, receiver: tuple[socket.socket, str]) -> None:
    """Journal when stdout is the journal, syslog when stdout is /dev/null, else the stream."""
    _sock, path = receiver
    missing = str(tmp_path / "missing")
    with open(tmp_path / "out", "w") as f, open(os.devnull, "w") as null:
        st = os.fstat(f.fileno())
        env = {"JOURNAL_STREAM": f"{st.st_dev}:{st.st_ino}"}
        assert choose_destination(f.fileno(), env, journal_socket=path) == "journal"
        # systemd said journal but its socket is not there: stay on the stream.
        assert choose_destination(f.fileno(), env, journal_socket=missing) == "stream"
        assert choose_destination(f.fileno(), {}, journal_socket=path) == "stream"
        assert choose_destination(null.fileno(), {}, syslog_socket=path) == "syslog"
        assert choose_destination(null.fileno(), {}, syslog_socket=missing) == "stream"


def test_maillog_file_wins_over_the_journal(tmp_path: Path) -> None:
    """With maillog_file set, the file is written even when stdout is the journal."""
    with open(tmp_path / "out", "w") as f:
        st = os.fstat(f.fileno())
        out = LogOutput(
            maillog_file=tmp_path / "maillog",
            environ={"JOURNAL_STREAM": f"{st.st_dev}:{st.st_ino}"},
        )
        out.close()
    assert out.destination == "stream"


@pytest.mark.parametrize("name", ["", "qmgrd/x", "mail d", "a[1]", "x:y"])
def test_bad_syslog_name_is_a_config_error(name: str) -> None:
    """A syslog_name log tools could not split out of the line is refused, naming the parameter."""
    with pytest.raises(ConfigError, match=r"^syslog_name: "):
        configure_logging("postfix", destination="stream", program=name)
