"""``DaemonProcess``: ``qmgrd -c DIR run`` as a subprocess, the way systemd runs it.

Readiness is an event, not a guess: the process gets ``NOTIFY_SOCKET`` pointing
at a datagram socket the test owns, and ``wait_ready()`` returns when the
daemon sends ``READY=1`` (after recovery, with the listener bound). Every
sd_notify datagram is kept in ``notifications``, and the pid that sent it
(``SCM_CREDENTIALS``, as systemd checks ``NotifyAccess=``) in ``senders``;
``wait_notify(state)`` waits for the next one carrying ``state``
(``RELOADING=1``, ``STOPPING=1``). ``argv`` replaces the command (a unit's
``ExecStart``); ``new_session`` starts it as the leader of a process group of
its own, so ``group()`` lists its processes as systemd's cgroup would and
``signal_group`` signals them all at once (``KillMode=control-group``).

Standard output and error are read by a thread into ``lines``; ``wait_for(needle)``
blocks on that thread's condition (no polling) until a line containing
``needle`` arrives, and returns the lines since the previous ``wait_for``.
Async tests use ``await wait_line(needle)`` (woken by each line through
``changes``) and call ``wait_ready`` through ``asyncio.to_thread``.

``running_daemon_process`` starts one, waits until it is ready and, on exit,
stops it with SIGTERM (SIGKILL if it does not stop within the timeout).
``qmgrd(conf, *args)`` runs one CLI command to completion.
Every wait is bounded by ``TIMEOUT``.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from tests.support.config import REPO
from tests.support.waits import Changes

TIMEOUT = 30.0
_serial = itertools.count()


def qmgrd(conf: Path, *args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    """Run ``qmgrd -c conf ARGS`` to completion (bounded); output captured as text."""
    return subprocess.run(
        [sys.executable, "-m", "qmgrd", "-c", str(conf), *args],
        cwd=REPO,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
    )


class DaemonProcess:
    """One ``qmgrd run`` process (see the module docstring)."""

    def __init__(
        self,
        conf: Path,
        *,
        umask: int | None = None,
        argv: Sequence[str] | None = None,
        new_session: bool = False,
    ) -> None:
        """Prepare (not start) a daemon for the configuration directory ``conf``."""
        self.conf = conf
        self.umask = umask
        self.argv = list(argv or [sys.executable, "-m", "qmgrd", "-c", str(conf), "run"])
        self.new_session = new_session
        self.lines: list[str] = []
        self.notifications: list[str] = []
        self.senders: list[int] = []  # the pid that sent each notification
        self.started_at = 0.0
        self._cursor = 0
        self._eof = False
        self._cond = threading.Condition()
        self.changes = Changes()
        self._notify_dir: Path | None = None
        self._notify_path = conf.parent / f"notify-{os.getpid()}-{next(_serial)}.sock"
        if len(str(self._notify_path)) > 100:  # AF_UNIX paths hold 107 bytes at most
            self._notify_dir = Path(tempfile.mkdtemp(prefix="qmgrd-notify-"))
            self._notify_path = self._notify_dir / "notify.sock"
        self._notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._notify.bind(str(self._notify_path))
        self._notify.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
        self._proc: subprocess.Popen[bytes] | None = None
        self._reader: threading.Thread | None = None

    @property
    def proc(self) -> subprocess.Popen[bytes]:
        """The running (or finished) process."""
        assert self._proc is not None, "not started"
        return self._proc

    def start(self) -> DaemonProcess:
        """Start the process (it is not ready yet: see ``wait_ready``)."""
        umask = self.umask
        preexec: Callable[[], object] | None = None
        if umask is not None:

            def preexec() -> object:
                return os.umask(umask)

        self.started_at = time.time()
        self._proc = subprocess.Popen(
            self.argv,
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1", "NOTIFY_SOCKET": str(self._notify_path)},
            preexec_fn=preexec,
            start_new_session=self.new_session,
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        return self

    def _read(self) -> None:
        stdout = self.proc.stdout
        assert stdout is not None
        for raw in stdout:
            with self._cond:
                self.lines.append(raw.decode("utf-8", "replace").rstrip("\n"))
                self._cond.notify_all()
            self.changes.notify()
        with self._cond:
            self._eof = True
            self._cond.notify_all()
        self.changes.notify()

    def wait_for(self, needle: str, timeout: float = TIMEOUT) -> list[str]:
        """Lines since the last call, up to the first one containing ``needle`` (bounded)."""
        deadline = time.monotonic() + timeout
        with self._cond:
            first = self._cursor
            while True:
                while self._cursor < len(self.lines):
                    self._cursor += 1
                    if needle in self.lines[self._cursor - 1]:
                        return self.lines[first : self._cursor]
                remaining = deadline - time.monotonic()
                if self._eof or remaining <= 0:
                    raise AssertionError(f"no {needle!r} in the daemon's output: {self.lines}")
                self._cond.wait(remaining)

    def saw(self, needle: str) -> bool:
        """Whether any line so far contains ``needle``."""
        with self._cond:
            return any(needle in line for line in self.lines)

    async def wait_line(self, needle: str, timeout: float = TIMEOUT) -> None:
        """Return once some line contains ``needle`` (woken by each new line, bounded)."""
        checked = 0
        found = False

        def seen() -> bool:
            nonlocal checked, found
            with self._cond:
                new, checked = self.lines[checked:], len(self.lines)
            found = found or any(needle in line for line in new)
            return found

        await self.changes.wait_for(seen, f"{needle!r} in the daemon's output", timeout)

    def wait_notify(self, state: str, timeout: float = TIMEOUT) -> str:
        """The next sd_notify datagram that carries ``state`` (e.g. ``READY=1``), bounded."""
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AssertionError(f"no {state} from the daemon: {self.notifications}")
            self._notify.settimeout(remaining)
            try:
                data, ancillary, _flags, _addr = self._notify.recvmsg(4096, socket.CMSG_SPACE(12))
            except TimeoutError:
                continue
            message = data.decode()
            self.notifications.append(message)
            self.senders.append(_sender(ancillary))
            if state in message.split("\n"):
                return message

    def wait_ready(self, timeout: float = TIMEOUT) -> None:
        """Return when the daemon told its supervisor ``READY=1``."""
        self.wait_notify("READY=1", timeout)

    def children(self) -> list[int]:
        """The daemon's child processes now (its listener workers), from /proc (Linux)."""
        pid = self.proc.pid
        try:
            text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
        except FileNotFoundError:
            return []
        return sorted(int(word) for word in text.split())

    def group(self) -> list[int]:
        """The processes of its process group (``new_session``: the daemon and its workers)."""
        out = []
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                try:
                    stat = (entry / "stat").read_text()
                except OSError:
                    continue  # gone meanwhile
                if int(stat.rsplit(")", 1)[1].split()[2]) == self.proc.pid:
                    out.append(int(entry.name))
        return sorted(out)

    def signal_group(self, signum: int) -> None:
        """Send ``signum`` to every process of its group at once (``new_session``)."""
        os.killpg(self.proc.pid, signum)

    def send_signal(self, signum: int) -> None:
        """Send ``signum`` to the daemon."""
        self.proc.send_signal(signum)

    def stop(self, signum: int = signal.SIGTERM, timeout: float = TIMEOUT) -> int:
        """Signal the daemon and return its exit code (bounded); its output is then complete."""
        self.proc.send_signal(signum)
        code = self.proc.wait(timeout)
        self._join()
        return code

    def kill(self) -> None:
        """SIGKILL (a crash); returns when the process is gone and its output read."""
        self.stop(signal.SIGKILL)

    def _join(self) -> None:
        if self._reader is not None:
            self._reader.join(TIMEOUT)

    def close(self) -> None:
        """Stop the daemon if it still runs (SIGTERM, then SIGKILL) and release everything."""
        if self._proc is not None:
            if self._proc.poll() is None:
                self._proc.send_signal(signal.SIGTERM)
                try:
                    self._proc.wait(TIMEOUT)
                except subprocess.TimeoutExpired:
                    self._proc.kill()
                    self._proc.wait(TIMEOUT)
            self._join()
            if self._proc.stdout is not None:
                self._proc.stdout.close()
        self._notify.close()
        with contextlib.suppress(FileNotFoundError):
            self._notify_path.unlink()
        if self._notify_dir is not None:
            self._notify_dir.rmdir()


def _sender(ancillary: list[tuple[int, int, bytes]]) -> int:
    """The sender's pid from a datagram's ``SCM_CREDENTIALS`` (0 when there is none)."""
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS:
            return int(struct.unpack("iII", data[:12])[0])
    return 0


@contextlib.contextmanager
def running_daemon_process(conf: Path, *, umask: int | None = None) -> Iterator[DaemonProcess]:
    """A started, ready ``DaemonProcess``, closed on exit."""
    daemon = DaemonProcess(conf, umask=umask)
    try:
        daemon.start()
        daemon.wait_ready()
        yield daemon
    finally:
        daemon.close()
