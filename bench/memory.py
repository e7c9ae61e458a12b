"""Memory benchmark: the daemon's peak RSS (VmHWM) in three situations.

Each scenario starts a fresh ``qmgrd -c DIR run`` subprocess (fsync on, real
SMTP agents) relaying to sinks in a separate process
(``tests/integration/sinkproc.py``), drives it from this process, waits until
the spool is empty again, and reads ``VmHWM`` (the peak resident set) and
``VmRSS`` from ``/proc/PID/status``:

- ``idle``: started, nothing sent (the baseline);
- ``10k-rcpt``: one client sends one message with 10,000 recipients
  (``smtpd_recipient_limit = 10000``) that is then delivered in 200 batches;
- ``500-clients``: 500 clients connect at once, each sends one 1 KB message.

Prints one line per scenario; never asserts anything::

    .venv/bin/python bench/memory.py
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
SINKPROC = REPO / "tests" / "integration" / "sinkproc.py"
TIMEOUT = 300.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _status(pid: int) -> dict[str, int]:
    """VmHWM and VmRSS of a process, in KiB."""
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmHWM", "VmRSS"):
            out[key] = int(value.split()[0])
    return out


class Daemon:
    """A qmgrd subprocess with its own config and spool under ``root``."""

    def __init__(
        self, root: Path, sink_port: int, *, rcpt_limit: int = 10_000, extra: str = ""
    ) -> None:
        self.root = root
        self.port = _free_port()
        conf = root / "etc"
        conf.mkdir(parents=True, exist_ok=True)
        (conf / "main.cf").write_text(
            f"queue_directory = {root / 'spool'}\n"
            f"smtpd_listen = 127.0.0.1:{self.port}\n"
            "myhostname = mx.test\n"
            f"relayhost = [127.0.0.1]:{sink_port}\n"
            f"smtpd_recipient_limit = {rcpt_limit}\n" + extra
        )
        (conf / "master.cf").write_text((REPO / "config" / "master.cf").read_text())
        self.log = open(root / "daemon.log", "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "qmgrd", "-c", str(conf), "run"],
            cwd=REPO,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        deadline = time.monotonic() + 30
        while b"daemon started" not in (root / "daemon.log").read_bytes():
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise RuntimeError("daemon did not start")
            time.sleep(0.05)

    def spool_empty(self) -> bool:
        spool = self.root / "spool"
        return not any(os.listdir(spool / q) for q in ("incoming", "active", "deferred"))

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(60)
        self.log.close()


async def _smtp(port: int, sender: str, rcpts: list[str], body: bytes) -> None:
    """One pipelined SMTP transaction over raw streams (cheap for the client)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        await reader.readline()
        writer.write(b"EHLO bench.test\r\n")
        while (await reader.readline())[3:4] == b"-":
            pass
        head = [f"MAIL FROM:<{sender}>\r\n".encode()]
        head += [f"RCPT TO:<{r}>\r\n".encode() for r in rcpts]
        writer.write(b"".join(head) + b"DATA\r\n")
        for _ in range(len(rcpts) + 2):
            line = await reader.readline()
            if not line.startswith((b"250", b"354")):
                raise RuntimeError(f"unexpected reply {line!r}")
        writer.write(body + b"\r\n.\r\nQUIT\r\n")
        line = await reader.readline()
        if not line.startswith(b"250"):
            raise RuntimeError(f"message refused: {line!r}")
    finally:
        writer.close()


def _body(size: int) -> bytes:
    head = b"From: s@src.test\r\nSubject: bench\r\n\r\n"
    return head + b"x" * 70 + b"\r\n" * max(0, (size - len(head)) // 72)


async def _idle(_port: int) -> None:
    return None


async def _ten_thousand(port: int) -> None:
    rcpts = [f"user{i}@dst{i % 7}.test" for i in range(10_000)]
    await _smtp(port, "s@src.test", rcpts, _body(2048))


async def _five_hundred(port: int) -> None:
    await asyncio.gather(
        *(_smtp(port, f"s{i}@src.test", [f"r{i}@dst.test"], _body(1024)) for i in range(500))
    )


def _scenario(name: str, drive: Callable[[int], Coroutine[Any, Any, None]], sink_port: int) -> None:
    root = Path(tempfile.mkdtemp(prefix=f"qmgrd-mem-{name}-"))
    daemon = Daemon(root, sink_port)
    try:
        started = time.monotonic()
        asyncio.run(drive(daemon.port))
        accepted = time.monotonic() - started
        deadline = time.monotonic() + TIMEOUT
        while not daemon.spool_empty():
            if time.monotonic() > deadline:
                raise RuntimeError(f"{name}: spool not empty after {TIMEOUT}s")
            time.sleep(0.05)
        total = time.monotonic() - started
        mem = _status(daemon.proc.pid)
        print(
            f"{name:12s} peak RSS (VmHWM) {mem['VmHWM'] / 1024:7.1f} MiB   "
            f"RSS after {mem['VmRSS'] / 1024:7.1f} MiB   "
            f"accepted in {accepted:5.2f}s, delivered in {total:5.2f}s",
            flush=True,
        )
    finally:
        daemon.stop()
        shutil.rmtree(root, ignore_errors=True)


def main() -> None:
    sink_dir = Path(tempfile.mkdtemp(prefix="qmgrd-mem-sink-"))
    sinks = subprocess.Popen(
        [sys.executable, str(SINKPROC), str(sink_dir / "deliveries.log"), "1"],
        stdout=subprocess.PIPE,
    )
    try:
        assert sinks.stdout is not None
        sink_port = int(sinks.stdout.readline().split()[1])
        for name, drive in (
            ("idle", _idle),
            ("10k-rcpt", _ten_thousand),
            ("500-clients", _five_hundred),
        ):
            _scenario(name, drive, sink_port)
    finally:
        sinks.terminate()
        sinks.wait(30)
        shutil.rmtree(sink_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
