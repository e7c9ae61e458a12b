"""Intake benchmark: messages/s accepted over SMTP, and server CPU ms per message.

Runs the listener (with its group commit, fsync on) in a child process on
uvloop, and drives it from this process with lean pipelining SMTP clients
(raw asyncio streams: one write for MAIL+RCPT+DATA, one for the content), so
the client costs as little CPU as possible on a small machine. Each client
keeps one session and sends messages back to back. Prints one line per
(clients, size) cell; never asserts anything.

    .venv/bin/python bench/intake.py              # 1/10/50 clients x 1 KB/100 KB
    .venv/bin/python bench/intake.py --no-fsync   # the same without fsync (comparison)
    .venv/bin/python bench/intake.py --cleanup none|on|checks20   # cleanup at DATA (default on:
        Received:, hop count, missing headers; checks20: plus a 20-rule regexp header_checks)
"""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _cleanup_settings(root: Path, mode: str) -> object:
    """The daemon's CleanupSettings for a bench config (None: cleanup off)."""
    if mode == "none":
        return None
    from qmgrd.cleanup import CleanupSettings
    from qmgrd.config import load_config

    conf = root / "etc"
    conf.mkdir(parents=True, exist_ok=True)
    main = f"myhostname = bench.test\nqueue_directory = {root / 'spool'}\n"
    if mode == "checks20":
        rules = "".join(f"/^Subject: .*never-matches-{i}/ REJECT rule {i}\n" for i in range(20))
        (conf / "header_checks").write_text(rules)
        main += f"header_checks = regexp:{conf / 'header_checks'}\n"
    (conf / "main.cf").write_text(main)
    shutil.copy(REPO / "config" / "master.cf", conf / "master.cf")
    return CleanupSettings.from_config(load_config(conf, hostname="bench.test"))


def _serve(root: str, fsync: bool, cleanup_mode: str = "on") -> None:
    """Child process: run the listener until stdin closes; print the port first."""
    sys.path.insert(0, str(REPO))
    from qmgrd.cleanup import CleanupSettings
    from qmgrd.listener import ListenerSettings, start_listener
    from qmgrd.spool import Spool

    cleanup = _cleanup_settings(Path(root).parent, cleanup_mode)
    assert cleanup is None or isinstance(cleanup, CleanupSettings)

    async def main() -> None:
        spool = Spool(Path(root), fsync=fsync)
        spool.ensure_dirs()
        settings = ListenerSettings(
            listen=(("127.0.0.1", 0),),
            myhostname="bench.test",
            mynetworks=(ipaddress.ip_network("127.0.0.0/8"),),
            message_size_limit=10_240_000,
            smtpd_recipient_limit=1000,
            smtpd_timeout=300,
            cleanup=cleanup,
        )
        handle = await start_listener(settings, spool, on_commit=lambda _q: None)
        print(handle.addresses[0][1], flush=True)
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, sys.stdin.read)
        await handle.wait_closed()

    import logging

    import structlog

    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    try:
        import uvloop

        uvloop.run(main())
    except ImportError:
        asyncio.run(main())


def _message(size: int) -> bytes:
    line = b"x" * 76 + b"\r\n"
    head = b"From: a@bench.test\r\nTo: b@bench.test\r\nSubject: bench\r\n\r\n"
    body = line * max(1, (size - len(head)) // len(line))
    return head + body + b".\r\n"


async def _client(port: int, count: int, content: bytes, done: list[int]) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    await reader.readline()
    writer.write(b"EHLO bench\r\n")
    while not (await reader.readline()).startswith(b"250 "):
        pass
    envelope = b"MAIL FROM:<a@bench.test>\r\nRCPT TO:<b@bench.test>\r\nDATA\r\n"
    for _ in range(count):
        writer.write(envelope)
        for _ in range(3):
            reply = await reader.readline()
        if not reply.startswith(b"354"):
            raise RuntimeError(f"unexpected reply {reply!r}")
        writer.write(content)
        reply = await reader.readline()
        if not reply.startswith(b"250"):
            raise RuntimeError(f"not accepted: {reply!r}")
        done[0] += 1
    writer.write(b"QUIT\r\n")
    await reader.readline()
    writer.close()


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _cell(port: int, pid: int, clients: int, size: int, total: int) -> str:
    content = _message(size)
    per_client = max(1, total // clients)
    done = [0]
    cpu0, self0, t0 = _cpu_seconds(pid), time.process_time(), time.perf_counter()
    await asyncio.gather(*(_client(port, per_client, content, done) for _ in range(clients)))
    elapsed = time.perf_counter() - t0
    cpu = _cpu_seconds(pid) - cpu0
    client_cpu = time.process_time() - self0
    n = done[0]
    return (
        f"clients={clients:>3} size={size // 1024:>3}KB messages={n:>5} "
        f"rate={n / elapsed:8.0f} msg/s  server_cpu={cpu * 1000 / n:6.3f} ms/msg  "
        f"client_cpu={client_cpu * 1000 / n:6.3f} ms/msg  wall={elapsed:5.2f}s"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-fsync", action="store_true", help="disable fsync (comparison)")
    parser.add_argument("--serve", help=argparse.SUPPRESS)
    parser.add_argument("--cleanup", choices=("none", "on", "checks20"), default="on")
    parser.add_argument("--sizes", default="1,100", help="message sizes in KB (comma list)")
    parser.add_argument("--clients", default="1,10,50", help="client counts (comma list)")
    parser.add_argument("--scale", type=float, default=1.0, help="multiply message counts")
    args = parser.parse_args()
    if args.serve:
        _serve(args.serve, not args.no_fsync, args.cleanup)
        return
    root = Path(tempfile.mkdtemp(prefix="qmgrd-bench-", dir=str(REPO / "bench")))
    cmd = [sys.executable, __file__, "--serve", str(root / "spool"), "--cleanup", args.cleanup]
    if args.no_fsync:
        cmd.append("--no-fsync")
    child = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None
        port = int(child.stdout.readline())
        print(
            f"fsync={'off' if args.no_fsync else 'on'} cleanup={args.cleanup} "
            f"cpus={os.cpu_count()} spool={root}"
        )
        totals = {1: 3000, 100: 600}
        for kb in (int(x) for x in args.sizes.split(",")):
            size, total = kb * 1024, totals.get(kb, 600)
            for clients in (int(x) for x in args.clients.split(",")):
                line = asyncio.run(_cell(port, child.pid, clients, size, int(total * args.scale)))
                print(line, flush=True)
                shutil.rmtree(root / "spool" / "incoming")
                (root / "spool" / "incoming").mkdir()
    finally:
        if child.stdin:
            child.stdin.close()
        child.wait(30)
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
