"""Client-pressure benchmark: the daemon's memory and latency under hostile client loads.

Each scenario starts a fresh ``qmgrd -c DIR run`` subprocess (``bench/memory.py``'s
``Daemon``, fsync on) and drives it from this process over SMTP on 127.0.0.1:

- ``data150``: 150 sessions at once each send 10 MB of DATA in 64 KiB pieces
  and never finish it; once every byte is written (and the daemon has read
  it: the RSS stops growing), the daemon's ``VmRSS`` and ``VmHWM`` are read,
  the sessions are dropped, and ``VmRSS`` is read again;
- ``authflood``: 200 sessions fail AUTH PLAIN in a loop (three failures, 421,
  reconnect) while one ordinary client from mynetworks sends a 1 KB message
  every 0.5 s; prints the ordinary client's time from connecting to its
  ``250 ... queued`` (median and max of 10 samples);
- ``million``: one client sends one message with 1,000,000 pipelined
  recipients; prints the daemon's peak RSS (delivery goes to a closed port,
  so the message is only accepted and deferred).

Prints one line per scenario; never asserts anything::

    .venv/bin/python bench/clients.py [data150] [authflood] [million]
"""

from __future__ import annotations

import asyncio
import base64
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.memory import Daemon, _free_port, _status
from qmgrd.listener.auth import hash_password

DATA_SESSIONS = 150
DATA_BYTES = 10_000_000
FLOOD_SESSIONS = 200
SAMPLES = 10


async def _reply(reader: asyncio.StreamReader) -> bytes:
    """A whole (possibly multi-line) reply; returns its last line."""
    while True:
        line = await reader.readline()
        if not line:
            raise ConnectionError("connection closed")
        if line[3:4] != b"-":
            return line


async def _open(port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    await _reply(reader)
    writer.write(b"EHLO bench.test\r\n")
    await _reply(reader)
    return reader, writer


async def _slow_data(port: int, sent: list[int]) -> asyncio.StreamWriter:
    reader, writer = await _open(port)
    writer.write(b"MAIL FROM:<s@src.test>\r\nRCPT TO:<r@dst.test>\r\nDATA\r\n")
    for _ in range(3):
        await _reply(reader)
    piece = (b"x" * 78 + b"\r\n") * 819  # 65,520 bytes
    total = 0
    while total < DATA_BYTES:
        writer.write(piece)
        await writer.drain()
        total += len(piece)
        await asyncio.sleep(0.01)
    sent[0] += 1
    return writer


async def _data150(daemon: Daemon) -> str:
    pid = daemon.proc.pid
    before = _status(pid)
    sent = [0]
    writers = await asyncio.gather(*(_slow_data(daemon.port, sent) for _ in range(DATA_SESSIONS)))
    last = -1
    for _ in range(60):  # until the daemon's RSS stops moving (it has read what we sent)
        await asyncio.sleep(1)
        rss = _status(pid)["VmRSS"]
        if abs(rss - last) < 1024:
            break
        last = rss
    during = _status(pid)
    for writer in writers:
        writer.transport.abort()
    await asyncio.sleep(3)
    after = _status(pid)
    return (
        f"data150  {sent[0]} sessions x {DATA_BYTES / 1e6:.0f} MB unfinished: "
        f"RSS idle {before['VmRSS'] / 1024:.1f} MiB, with the sessions "
        f"{during['VmRSS'] / 1024:.1f} MiB (peak {during['VmHWM'] / 1024:.1f} MiB), "
        f"3 s after dropping them {after['VmRSS'] / 1024:.1f} MiB"
    )


async def _flooder(port: int, stop: asyncio.Event, counter: list[int]) -> None:
    bad = base64.b64encode(b"\0alice\0wrong").decode()
    while not stop.is_set():
        try:
            reader, writer = await _open(port)
            try:
                for _ in range(3):
                    writer.write(f"AUTH PLAIN {bad}\r\n".encode())
                    line = await _reply(reader)
                    counter[0] += 1
                    if not line.startswith(b"535") or stop.is_set():
                        break
            finally:
                writer.close()
        except (ConnectionError, OSError):
            await asyncio.sleep(0.05)


async def _good_client(port: int) -> float:
    started = time.monotonic()
    reader, writer = await _open(port)
    try:
        writer.write(b"MAIL FROM:<s@src.test>\r\nRCPT TO:<r@dst.test>\r\nDATA\r\n")
        for _ in range(3):
            await _reply(reader)
        writer.write(b"Subject: x\r\n\r\n" + b"y" * 1000 + b"\r\n.\r\n")
        line = await _reply(reader)
        if not line.startswith(b"250"):
            raise RuntimeError(f"refused: {line!r}")
        return time.monotonic() - started
    finally:
        writer.close()


async def _authflood(daemon: Daemon) -> str:
    stop = asyncio.Event()
    counter = [0]
    flood = [
        asyncio.create_task(_flooder(daemon.port, stop, counter)) for _ in range(FLOOD_SESSIONS)
    ]
    await asyncio.sleep(2)
    samples = []
    for _ in range(SAMPLES):
        samples.append(await _good_client(daemon.port))
        print(f"  sample {samples[-1]:.2f}s", file=sys.stderr, flush=True)
        await asyncio.sleep(0.5)
    stop.set()
    for task in flood:  # a flooder may wait long for its reply: do not wait for it
        task.cancel()
    await asyncio.gather(*flood, return_exceptions=True)
    return (
        f"authflood {FLOOD_SESSIONS} sessions sending bad AUTH ({counter[0]} AUTH replies): "
        f"good client's connect-to-250 median {statistics.median(samples):.2f}s "
        f"max {max(samples):.2f}s over {SAMPLES}"
    )


async def _million(daemon: Daemon) -> str:
    reader, writer = await _open(daemon.port)
    started = time.monotonic()
    writer.write(b"MAIL FROM:<s@src.test>\r\n")
    await _reply(reader)

    async def send() -> None:
        for block in range(1000):
            writer.write(
                b"".join(f"RCPT TO:<u{block}x{i}@d{i % 7}.test>\r\n".encode() for i in range(1000))
            )
            await writer.drain()
        writer.write(b"DATA\r\n")

    sender = asyncio.create_task(send())
    refused = 0
    for _ in range(1_000_000):
        if not (await _reply(reader)).startswith(b"250"):
            refused += 1
    await sender
    await _reply(reader)  # 354
    writer.write(b"Subject: x\r\n\r\nhello\r\n.\r\nQUIT\r\n")
    line = await _reply(reader)
    accepted = time.monotonic() - started
    writer.close()
    mem = _status(daemon.proc.pid)
    return (
        f"million  1,000,000 recipients ({refused} refused) -> {line.decode().strip()!r} "
        f"in {accepted:.1f}s: peak RSS (VmHWM) {mem['VmHWM'] / 1024:.1f} MiB"
    )


def main() -> None:
    names = sys.argv[1:] or ["data150", "authflood", "million"]
    scenarios = {"data150": _data150, "authflood": _authflood, "million": _million}
    for name in names:
        root = Path(tempfile.mkdtemp(prefix=f"qmgrd-clients-{name}-"))
        (root / "etc").mkdir()
        (root / "etc" / "passwd").write_text(f"alice:{hash_password('secret')}\n", encoding="utf-8")
        extra = (
            f"smtpd_sasl_auth_enable = yes\nsmtpd_sasl_password_file = {root / 'etc' / 'passwd'}\n"
        )
        daemon = Daemon(root, _free_port(), rcpt_limit=1_000_000, extra=extra)
        try:
            print(asyncio.run(scenarios[name](daemon)), flush=True)
        finally:
            daemon.stop()
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
