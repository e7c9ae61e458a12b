"""The queue manager's own path per message, without SMTP: CPU ms/msg of load, schedule, finish.

    .venv/bin/python bench/qmgrpath.py                       # 1 KB and 100 KB, 3000 messages
    /work/main/.venv/bin/python bench/qmgrpath.py --repo /work/main   # the same, another tree

``-m`` messages are committed to a fresh spool first and moved aside; then each
is moved back into ``incoming/`` and handed to a real engine
(``qmgrd.daemon.assemble.create_engine`` with the daemon's regulated
``WorkPool``, Postfix-format logging to a maillog file, fsync on) as a
listener's commit notice (``notify_incoming`` with its flow facts), ``--rate``
messages per second in groups of ``--burst``, on uvloop. An in-process agent reads each delivery's
whole content and answers 250 for every recipient. What is measured is this
process's CPU (``time.process_time``: every thread) from the first notice
until the engine is idle, per message: the queue manager's load, scheduling,
done bookkeeping, finish and log lines, without the SMTP client, the listener
or the notice channel. Alternate runs of two trees to compare them (the
machine's load moves the numbers; say it). ``--pace idle`` hands the next
burst over once the engine is idle instead of at the clock's rate: the work
then does not depend on how fast the process runs, so instruction counts under
``valgrind --tool=callgrind`` repeat (within 0.1 %; the rate-paced feed builds
a different backlog in each slowed-down run). Prints one line per size; never
asserts anything.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
parser.add_argument("--sizes", default="1,100", help="comma list of message sizes in KB")
parser.add_argument("-m", type=int, default=3000, help="messages per size")
parser.add_argument("--rate", type=float, default=800.0, help="commit notices per second")
parser.add_argument("--burst", type=int, default=8, help="notices handed in together")
parser.add_argument(
    "--pace",
    default="rate",
    choices=("rate", "idle"),
    help="rate: notices at --rate per second; idle: the next burst once the engine is idle "
    "(not paced by the clock: repeatable under callgrind)",
)
parser.add_argument("--repo", default=str(Path(__file__).resolve().parent.parent))
ARGS = parser.parse_args()
sys.path.insert(0, ARGS.repo)

from qmgrd.config import load_config  # noqa: E402
from qmgrd.daemon.assemble import create_engine  # noqa: E402
from qmgrd.daemon.process import loop_factory  # noqa: E402
from qmgrd.daemon.workpool import WorkPool  # noqa: E402
from qmgrd.delivery.agent import (  # noqa: E402
    DeliveryRequest,
    DeliveryResult,
    Outcome,
    RecipientResult,
)
from qmgrd.listener.flowgate import FlowFacts  # noqa: E402
from qmgrd.log import configure_logging  # noqa: E402
from qmgrd.spool import Envelope, RecipientSpec, Spool  # noqa: E402


class SinkAgent:
    """Reads the whole content, answers 250 for every recipient."""

    async def deliver(self, request: DeliveryRequest) -> DeliveryResult:
        """One delivery."""
        async for _chunk in request.content.chunks(256 * 1024):
            pass
        return DeliveryResult(
            tuple(
                RecipientResult(r, Outcome.SENT, "2.0.0", "250 2.0.0 Ok", "sink[127.0.0.1]:25")
                for r in request.recipients
            )
        )

    async def close(self) -> None:
        """Nothing to release."""


def _content(size: int) -> bytes:
    head = b"From: <s@bench.test>\r\nTo: <r@sink.test>\r\nSubject: bench\r\n\r\n"
    line = b"x" * 76 + b"\r\n"
    return head + line * max(1, (size - len(head)) // len(line))


async def _run(root: Path, size: int, count: int) -> tuple[float, float]:
    conf = root / "etc"
    conf.mkdir()
    (conf / "main.cf").write_text(
        f"queue_directory = {root / 'spool'}\nmyhostname = relay.bench\n"
        "mynetworks = 127.0.0.0/8\nrelayhost = [127.0.0.1]:25\n"
    )
    (conf / "master.cf").write_text((Path(ARGS.repo) / "config" / "master.cf").read_text())
    cfg = load_config(conf, hostname="relay.bench")
    spool = Spool(root / "spool")
    spool.ensure_dirs()
    setup = Spool(root / "spool", fsync=False)  # the messages to hand in (not measured)
    aside = root / "aside"
    aside.mkdir()
    content = _content(size)
    ids = []
    for i in range(count):
        env = Envelope("s@bench.test", (RecipientSpec(f"r{i}@sink.test"),), time.time())
        qid = setup.commit(env, content)
        os.rename(spool.path("incoming", qid), aside / qid)
        ids.append(qid)
    agent: Any = SinkAgent()
    engine = create_engine(cfg, spool=spool, agents={"smtp": agent, "relay": agent})
    pool = WorkPool()
    engine.ctx.io.pool = pool
    task = asyncio.get_running_loop().create_task(engine.run())
    await engine.wait_started()
    await engine.wait_idle()
    facts = FlowFacts("s@bench.test", "127.0.0.1", None)
    moves = [(qid, str(aside / qid), str(spool.path("incoming", qid))) for qid in ids]
    cpu, wall = time.process_time(), time.monotonic()
    gap = ARGS.burst / ARGS.rate
    for n in range(0, count, ARGS.burst):
        for qid, src, dst in moves[n : n + ARGS.burst]:
            os.rename(src, dst)
            engine.notify_incoming(qid, facts)
        if ARGS.pace == "idle":
            await engine.wait_idle()
            continue
        delay = wall + (n // ARGS.burst + 1) * gap - time.monotonic()
        await asyncio.sleep(max(0.0, delay))
    await asyncio.wait_for(engine.wait_idle(), 600)
    cpu, wall = time.process_time() - cpu, time.monotonic() - wall
    io = engine.ctx.io
    print(f"  thread hops {io.hops}, jobs {io.jobs} (since the start)")
    engine.stop()
    await task
    pool.close()
    left = spool.list_ids("incoming") + spool.list_ids("active") + spool.list_ids("deferred")
    if left:
        raise RuntimeError(f"{len(left)} messages not delivered")
    return cpu, wall


def main() -> None:
    """One line per size."""
    print(f"repo={ARGS.repo} m={ARGS.m} rate={ARGS.rate}/s burst={ARGS.burst}")
    for size_kb in (int(s) for s in ARGS.sizes.split(",")):
        root = Path(tempfile.mkdtemp(prefix="qmgrpath-"))
        try:
            output = configure_logging(maillog_file=root / "maillog", hostname="relay")
            with asyncio.Runner(loop_factory=loop_factory()) as runner:
                cpu, wall = runner.run(_run(root, size_kb * 1024, ARGS.m))
            output.close()
        finally:
            shutil.rmtree(root, ignore_errors=True)
        print(
            f"{size_kb}k  cpu ms/msg={1000 * cpu / ARGS.m:.3f}  wall={wall:.2f}s  "
            f"loadavg={os.getloadavg()[0]:.1f}"
        )


if __name__ == "__main__":
    main()
