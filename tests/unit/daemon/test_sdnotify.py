"""sd_notify tests: real AF_UNIX datagram sockets standing in for systemd's notify socket."""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from qmgrd.daemon.sdnotify import Notifier, notify


@pytest.fixture
def receiver(tmp_path: Path) -> Iterator[tuple[str, socket.socket]]:
    """A bound datagram socket in tmp_path and its path, as systemd would create it."""
    path = str(tmp_path / "notify")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(path)
    sock.settimeout(5)
    try:
        yield path, sock
    finally:
        sock.close()


def _recv(sock: socket.socket) -> str:
    return sock.recv(4096).decode()


def test_ready_sends_one_datagram(receiver: tuple[str, socket.socket]) -> None:
    """ready() sends exactly READY=1 to the socket named by the path."""
    path, sock = receiver
    assert Notifier(path).ready() is True
    assert _recv(sock) == "READY=1"


def test_status_is_appended_on_one_line(receiver: tuple[str, socket.socket]) -> None:
    """A status with newlines is flattened so it cannot inject other assignments."""
    path, sock = receiver
    Notifier(path).stopping(status="draining\nREADY=1")
    assert _recv(sock) == "STOPPING=1\nSTATUS=draining READY=1"
    Notifier(path).status("3 deliveries")
    assert _recv(sock) == "STATUS=3 deliveries"


def test_reloading_carries_monotonic_usec(receiver: tuple[str, socket.socket]) -> None:
    """RELOADING=1 comes with the CLOCK_MONOTONIC time in microseconds (systemd >= 253)."""
    path, sock = receiver
    before = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
    Notifier(path).reloading()
    after = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
    first, second = _recv(sock).split("\n")
    assert first == "RELOADING=1"
    key, value = second.split("=")
    assert key == "MONOTONIC_USEC"
    assert before <= int(value) <= after


def test_abstract_namespace() -> None:
    """A name starting with @ addresses the abstract namespace (leading NUL)."""
    name = f"qmgrd-test-{os.getpid()}-{time.monotonic_ns()}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(b"\0" + name.encode())
        sock.settimeout(5)
        assert Notifier("@" + name).notify("READY=1\nSTATUS=up") is True
        assert _recv(sock) == "READY=1\nSTATUS=up"


def test_unset_is_a_noop(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without $NOTIFY_SOCKET nothing is sent and nothing fails."""
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    assert Notifier.from_environment().enabled is False
    assert notify("READY=1") is False
    assert Notifier("").ready() is False
    assert Notifier("relative/path").enabled is False


def test_from_environment_reads_the_variable(
    receiver: tuple[str, socket.socket], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The module-level notify() uses $NOTIFY_SOCKET from the process environment."""
    path, sock = receiver
    monkeypatch.setenv("NOTIFY_SOCKET", path)
    assert notify("STATUS=hello") is True
    assert _recv(sock) == "STATUS=hello"
    assert Notifier.from_environment({"NOTIFY_SOCKET": path}).enabled


def test_missing_socket_does_not_raise(tmp_path: Path) -> None:
    """A supervisor that went away makes notify() return False instead of raising."""
    assert Notifier(str(tmp_path / "gone")).ready() is False
