"""Logging cost per message: the seven lines one relayed message writes, to a maillog_file.

Prints microseconds of CPU (``time.process_time``) per line and per message
for the lines the standard benchmark's messages produce (smtpd connect,
cleanup message-id, smtpd queued, smtpd disconnect, qmgr queued, smtp
status=sent, qmgr removed), rendered in the Postfix format with the syslog
prefix and written line by line to a temporary file, as the daemon does.
Each logger is used twice: through structlog (``get_logger(c).info``) and
through the direct path (``qmgrd.log.lines.LineLog``), which must write the
same bytes. Never asserts anything.

``--per-pass N`` logs from a running event loop, N messages per loop pass,
as the daemon does (its lines go to the file in one write per pass); without
it every line is written at once (one write system call per line).

    .venv/bin/python bench/loglines.py            # 20000 messages, both paths
    .venv/bin/python bench/loglines.py -n 50000 --path lines
    .venv/bin/python bench/loglines.py --per-pass 20
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from qmgrd.log import configure_logging, get_logger  # noqa: E402
from qmgrd.log.session import CommandCounts  # noqa: E402

LINES_PER_MESSAGE = 7


def one_message(smtpd: object, cleanup: object, qmgr: object, smtp: object, n: int) -> None:
    """The lines of message number ``n`` (fields as the daemon passes them)."""
    queue_id = f"4F{n:010X}"
    client = "unknown[127.0.0.1]"
    counts = CommandCounts()
    for verb in ("EHLO", "MAIL", "RCPT", "DATA", "QUIT"):
        counts.record(verb, ok=True)
    smtpd.info("connect", client=client)  # type: ignore[attr-defined]
    cleanup.info(  # type: ignore[attr-defined]
        "message-id", queue_id=queue_id, message_id=f"<{queue_id}@relay.bench>"
    )
    smtpd.info(  # type: ignore[attr-defined]
        "queued",
        queue_id=queue_id,
        client=client,
        from_="<a@src.bench>",
        size=1078,
        nrcpt=1,
        sasl_method=None,
        sasl_username=None,
    )
    smtpd.info("disconnect", client=client, commands=counts.as_field())  # type: ignore[attr-defined]
    qmgr.info(  # type: ignore[attr-defined]
        "queued", queue_id=queue_id, from_="<a@src.bench>", size=1402, nrcpt="1 (queue active)"
    )
    smtp.info(  # type: ignore[attr-defined]
        "delivered",
        queue_id=queue_id,
        to="<to@dst.bench>",
        relay="127.0.0.1[127.0.0.1]:2525",
        conn_use=2,
        delay=0.05,
        delays="0.01/0/0/0.04",
        dsn="2.0.0",
        status="sent",
        reply="250 2.0.0 Ok: queued as ABC",
        transport="smtp",
    )
    qmgr.info("removed", queue_id=queue_id)  # type: ignore[attr-defined]


def main() -> int:
    """Configure logging into a temporary file, write the lines, print the cost."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("-n", type=int, default=20000, help="messages")
    parser.add_argument(
        "--path", choices=("structlog", "lines", "both"), default="both", help="which log path"
    )
    parser.add_argument(
        "--per-pass", type=int, default=0, help="messages per event loop pass (0: no loop)"
    )
    args = parser.parse_args()
    paths = ("structlog", "lines") if args.path == "both" else (args.path,)
    for path in paths:
        with tempfile.TemporaryDirectory(prefix="bench-log-") as tmp:
            output = configure_logging("postfix", maillog_file=Path(tmp) / "maillog")
            loggers = [get_logger(c) for c in ("smtpd", "cleanup", "qmgr", "smtp")]
            if path == "lines":
                from qmgrd.log.lines import LineLog  # here: --path structlog runs on older trees

                loggers = [LineLog(log) for log in loggers]
            if args.per_pass > 0:
                cpu = asyncio.run(_in_loop(loggers, args.n, args.per_pass))
            else:
                smtpd, cleanup, qmgr, smtp = loggers
                for n in range(200):  # warm up
                    one_message(smtpd, cleanup, qmgr, smtp, n)
                t0 = time.process_time()
                for n in range(args.n):
                    one_message(smtpd, cleanup, qmgr, smtp, n)
                cpu = time.process_time() - t0
            output.close()
            lines = args.n * LINES_PER_MESSAGE
            print(
                f"path={path} per_pass={args.per_pass} messages={args.n} lines={lines} "
                f"cpu={cpu:.2f}s us/line={cpu * 1e6 / lines:.1f} "
                f"us/message={cpu * 1e6 / args.n:.1f}"
            )
    return 0


async def _in_loop(loggers: list[object], n: int, per_pass: int) -> float:
    """CPU seconds for ``n`` messages logged ``per_pass`` per loop pass."""
    smtpd, cleanup, qmgr, smtp = loggers
    for number in range(200):  # warm up
        one_message(smtpd, cleanup, qmgr, smtp, number)
    await asyncio.sleep(0)
    t0 = time.process_time()
    for number in range(n):
        one_message(smtpd, cleanup, qmgr, smtp, number)
        if number % per_pass == per_pass - 1:
            await asyncio.sleep(0)  # the pass ends: its lines are written in one go
    await asyncio.sleep(0)
    return time.process_time() - t0


if __name__ == "__main__":
    sys.exit(main())
