"""sd_notify: tell systemd the daemon's state (``Type=notify`` units), without libsystemd.

The protocol (sd_notify(3)) is one AF_UNIX datagram per state change, sent to
the socket named by ``$NOTIFY_SOCKET``, holding newline-separated
``KEY=VALUE`` assignments. A name starting with ``@`` is in the Linux
abstract namespace (the ``@`` becomes a NUL byte). When the variable is unset
(run by hand, in tests, under another supervisor) every call is a no-op.

Usage from the daemon::

    notifier = Notifier.from_environment()
    notifier.ready(status="accepting mail")     # after the listener is bound
    notifier.reloading()                        # on SIGHUP, before reloading
    notifier.ready()                            # reload finished
    notifier.stopping()                         # on SIGTERM, before draining
    notifier.status("42 deliveries in progress")

``RELOADING=1`` carries ``MONOTONIC_USEC`` (required by systemd >= 253 for
``Type=notify-reload`` and harmless for ``Type=notify``): the CLOCK_MONOTONIC
time the reload started, which systemd compares with its own reload request.

Sending never raises: a supervisor that went away must not take the mail
daemon down with it. Failures are returned as False (and logged once by the
caller if it cares).
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Mapping

__all__ = ["Notifier", "notify"]


def _address(value: str) -> str | bytes | None:
    """The socket address for ``$NOTIFY_SOCKET``: a path, an abstract name, or None."""
    if not value:
        return None
    if value.startswith("@"):
        # Abstract namespace: a leading NUL instead of "@", no terminating NUL.
        return b"\0" + value[1:].encode()
    if value.startswith("/"):
        return value
    # systemd also accepts vsock:CID:PORT; qmgrd never runs inside a VM guest agent.
    return None


class Notifier:
    """Sends sd_notify datagrams to one socket; a no-op when there is none."""

    __slots__ = ("_address",)

    def __init__(self, notify_socket: str | None) -> None:
        """``notify_socket`` is the value of ``$NOTIFY_SOCKET`` (None or "" = disabled)."""
        self._address = _address(notify_socket or "")

    @classmethod
    def from_environment(cls, environ: Mapping[str, str] | None = None) -> Notifier:
        """A notifier for ``$NOTIFY_SOCKET`` of ``environ`` (the process environment)."""
        env = os.environ if environ is None else environ
        return cls(env.get("NOTIFY_SOCKET"))

    @property
    def enabled(self) -> bool:
        """True when a notification socket is configured."""
        return self._address is not None

    def notify(self, state: str) -> bool:
        """Send ``state`` (``"READY=1"``, ``"STATUS=..."``, several joined by newlines).

        Returns True if the datagram was sent, False if disabled or sending failed.
        """
        if self._address is None:
            return False
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
                sock.connect(self._address)
                sock.sendall(state.encode())
        except OSError:
            return False
        return True

    def ready(self, status: str | None = None) -> bool:
        """Startup or reload finished: systemd considers the unit active."""
        return self.notify(_with_status("READY=1", status))

    def reloading(self, status: str | None = None) -> bool:
        """A reload (SIGHUP) started; ``ready()`` must follow when it is done."""
        usec = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
        return self.notify(_with_status(f"RELOADING=1\nMONOTONIC_USEC={usec}", status))

    def stopping(self, status: str | None = None) -> bool:
        """Shutdown started (deliveries in progress are being drained)."""
        return self.notify(_with_status("STOPPING=1", status))

    def status(self, text: str) -> bool:
        """A one-line free-form status shown by ``systemctl status``."""
        return self.notify(_with_status("", text))


def _with_status(state: str, status: str | None) -> str:
    if status is None:
        return state
    line = f"STATUS={' '.join(status.splitlines())}"
    return f"{state}\n{line}" if state else line


def notify(state: str) -> bool:
    """One-shot ``sd_notify(0, state)`` against the current ``$NOTIFY_SOCKET``."""
    return Notifier.from_environment().notify(state)
