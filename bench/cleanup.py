"""Cleanup and sendmail benchmarks: header processing CPU per message, submission rate.

Prints numbers; never asserts anything.

- ``headers``: CPU ms per message (``time.process_time``) of `HeaderProcessor`
  over a typical 14-header local message with a 2 KB body, fed in 64 KB
  chunks, without and with a 20-rule ``header_checks`` (regexp:, none of the
  rules matching, so every header is tried against all 20 patterns).
- ``sendmail``: messages/s written into maildrop/ by the ``sendmail`` command
  as a process (Python start-up included, fsync on), with the daemon stopped
  (nothing reads maildrop) and running (a `Pickup` on a thread moves each
  file through cleanup into incoming/ as it arrives, poked by the FIFO); and
  the in-process ``submit()`` rate (no interpreter start-up).

    .venv/bin/python bench/cleanup.py                 # both
    .venv/bin/python bench/cleanup.py headers -n 20000
    .venv/bin/python bench/cleanup.py sendmail -n 200
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from qmgrd.cleanup import (  # noqa: E402
    AddressRewriter,
    CleanupSettings,
    HeaderProcessor,
    MessageInfo,
    open_header_checks,
)
from qmgrd.tables import open_table  # noqa: E402

MESSAGE = (
    b"Return-Path: <alice@example.org>\r\n"
    b"Received: from mail.example.org (mail.example.org [192.0.2.1])\r\n"
    b"\tby mx.example.net with ESMTPS id 4Abc; Mon, 23 Nov 2026 08:00:00 +0000\r\n"
    b"From: Alice Example <alice@example.org>\r\n"
    b"To: Bob <bob@example.net>, carol@example.net\r\n"
    b"Cc: dave@example.net\r\n"
    b"Subject: Quarterly numbers and the plan for next week\r\n"
    b"Date: Mon, 23 Nov 2026 08:00:00 +0000\r\n"
    b"Message-ID: <20261123080000.4Abc@example.org>\r\n"
    b"MIME-Version: 1.0\r\n"
    b"Content-Type: text/plain; charset=utf-8\r\n"
    b"Content-Transfer-Encoding: 8bit\r\n"
    b"X-Mailer: bench\r\n"
    b"List-Id: <team.example.org>\r\n"
    b"\r\n" + (b"x" * 76 + b"\r\n") * 26
)


def _settings(rules: int) -> CleanupSettings:
    tables = []
    if rules:
        spec = (
            "regexp:{"
            + ", ".join(
                f"{{/^X-Spam-Rule-{i}:.*(viagra|casino|lottery)/ REJECT rule {i}}}"
                for i in range(rules)
            )
            + "}"
        )
        tables.append(open_table(spec, base_dir=REPO))
    return CleanupSettings(
        myhostname="mx.example.net",
        mail_name="qmgrd",
        rewriter=AddressRewriter(myorigin="example.net", mydomain="example.net"),
        header_checks=open_header_checks(tables, "header_checks", REPO),
    )


def bench_headers(n: int) -> None:
    import structlog

    structlog.configure(logger_factory=structlog.ReturnLoggerFactory())  # logging not measured
    for rules in (0, 20):
        settings = _settings(rules)
        for local in (False, True):
            start = time.process_time()
            for i in range(n):
                p = HeaderProcessor(
                    settings,
                    MessageInfo(
                        queue_id="1K0XPVYD16GR7YN",
                        sender="alice@example.org",
                        recipients=("bob@example.net",),
                        now=1.7e9 + i,
                        local=local,
                        helo="mail.example.org",
                        client_addr="192.0.2.1",
                    ),
                )
                p.feed(MESSAGE)
                p.finish()
            cpu = time.process_time() - start
            print(
                f"headers: header_checks rules={rules:2d} local_client={'yes' if local else 'no '} "
                f"n={n}: {cpu / n * 1000:.3f} ms CPU per message"
            )


def _config(root: Path) -> Path:
    conf = root / "etc"
    conf.mkdir()
    (conf / "main.cf").write_text(f"queue_directory = {root / 'spool'}\nmyhostname = h.example\n")
    (conf / "master.cf").write_text("smtp unix - - n - - smtp\n")
    return conf


def _process_rate(conf: Path, n: int) -> float:
    env = {**os.environ, "MAIL_CONFIG": str(conf), "PYTHONPATH": str(REPO)}
    start = time.perf_counter()
    for i in range(n):
        subprocess.run(
            [sys.executable, "-m", "qmgrd.sendmail", "-i", "r@example.net"],
            input=f"Subject: {i}\n\nbody\n".encode(),
            env=env,
            check=True,
        )
    return n / (time.perf_counter() - start)


def bench_sendmail(n: int) -> None:
    import structlog

    from qmgrd.config import load_config
    from qmgrd.daemon.pickup import Pickup
    from qmgrd.sendmail.command import submit
    from qmgrd.sendmail.maildrop import MaildropMessage
    from qmgrd.spool import Spool

    structlog.configure(logger_factory=structlog.ReturnLoggerFactory())
    with tempfile.TemporaryDirectory() as d:
        root = Path(d)
        conf = _config(root)
        cfg = load_config(conf)
        spool = Spool(root / "spool")
        spool.ensure_dirs()
        maildrop = cfg.get_path("maildrop_directory")
        pickup = Pickup(
            spool,
            maildrop,
            CleanupSettings.from_config(cfg),
            notify=lambda _q: None,
            size_limit=cfg.get_int("message_size_limit"),
        )
        pickup.ensure_dir()
        start = time.perf_counter()
        for i in range(n):
            submit(
                maildrop,
                MaildropMessage("u", ("r@example.net",), f"Subject: {i}\n\nbody\n".encode()),
            )
        rate = n / (time.perf_counter() - start)
        print(f"sendmail: in-process submit(), fsync, n={n}: {rate:.0f} msg/s")
        stopped = _process_rate(conf, n)
        print(f"sendmail: as a process, daemon stopped, n={n}: {stopped:.1f} msg/s")
        pickup.scan()  # empty maildrop before the running case
        stop = asyncio.Event()
        loop = asyncio.new_event_loop()
        thread = threading.Thread(target=loop.run_until_complete, args=(pickup.run(stop),))
        thread.start()
        time.sleep(0.5)  # let the pickup open the FIFO (benchmark set-up, not a measurement)
        running = _process_rate(conf, n)
        deadline = time.monotonic() + 60
        while len(os.listdir(maildrop)) > 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        loop.call_soon_threadsafe(stop.set)
        thread.join(60)
        queued = len(spool.list_ids("incoming"))
        print(
            f"sendmail: as a process, daemon running (pickup), n={n}: {running:.1f} msg/s; "
            f"incoming/ now holds {queued} (expected {3 * n})"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", nargs="?", choices=("headers", "sendmail", "all"), default="all")
    parser.add_argument("-n", type=int, default=0)
    args = parser.parse_args()
    if args.what in ("headers", "all"):
        bench_headers(args.n or 10000)
    if args.what in ("sendmail", "all"):
        bench_sendmail(args.n or 100)


if __name__ == "__main__":
    main()
