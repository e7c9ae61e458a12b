"""The queue manager's SMTP client alone: CPU ms per delivery into smtp-sink over cached sessions.

    .venv/bin/python bench/clientpath.py                       # 3000 x 1 KB, 20 in flight
    .venv/bin/python bench/clientpath.py -m 900 --inflight 20
    /work/main/.venv/bin/python bench/clientpath.py --repo /work/main   # the same, another tree

The standard benchmark's delivery side without the engine: ``smtp-sink`` (Postfix's, a
separate process, so its CPU is not counted) listens on a free loopback port; the
agent is built as the daemon builds it (``qmgrd.daemon.wiring.create_agents`` on a
``main.cf`` whose ``relayhost`` is the sink, the ``smtp`` service of the checkout's
``config/master.cf``), with Postfix-format logging to a maillog file as in the daemon.
One 1 KB message (``--size`` KB) is committed to a fresh spool; its content is what the
queue manager's load hands over (``QueueFileContent`` with the bytes already read, a new
one per delivery, as ``SharedReads.content`` does). ``-m`` deliveries of one recipient
each, with the LOAD and STORE flags a backlogged destination gets from the scheduler, run
``--inflight`` at a time on uvloop, so after the first round every delivery takes a
cached session (RSET probe pipelined with MAIL, RCPT and DATA, then the content).

Printed: this process's CPU (``time.process_time``) per delivery over all ``-m``
deliveries (the first ``--inflight`` open their connections), wall time, the agent's
counters and the outcomes. For instruction counts run it under callgrind at two ``-m``
and divide the difference by the difference in deliveries (start-up cancels out). A
benchmark prints; nothing is asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
parser.add_argument("-m", type=int, default=3000, help="deliveries (one recipient each)")
parser.add_argument("--inflight", type=int, default=20, help="deliveries at a time")
parser.add_argument("--size", type=int, default=1, help="message size in KB")
parser.add_argument("--repo", default=str(Path(__file__).resolve().parent.parent))
ARGS = parser.parse_args()
sys.path.insert(0, ARGS.repo)

from bench.postfix_bench import free_port, tool, wait_port  # noqa: E402
from qmgrd.config import load_config  # noqa: E402
from qmgrd.daemon.process import loop_factory  # noqa: E402
from qmgrd.daemon.wiring import create_agents  # noqa: E402
from qmgrd.delivery.agent import Agent, DeliveryRequest, Recipient  # noqa: E402
from qmgrd.log import configure_logging  # noqa: E402
from qmgrd.spool import Envelope, QueueFileContent, RecipientSpec, Spool  # noqa: E402
from qmgrd.spool.records import QueueFile  # noqa: E402


def _content(size: int) -> bytes:
    head = b"From: <s@bench.test>\r\nTo: <r@sink.test>\r\nSubject: bench\r\n\r\n"
    line = b"x" * 76 + b"\r\n"
    return head + line * max(1, (size - len(head)) // len(line))


def _agent(root: Path, port: int) -> Agent:
    conf = root / "etc"
    conf.mkdir()
    (conf / "main.cf").write_text(
        f"queue_directory = {root / 'spool'}\nmyhostname = relay.bench\n"
        f"mynetworks = 127.0.0.0/8\nrelayhost = [127.0.0.1]:{port}\n"
    )
    (conf / "master.cf").write_text((Path(ARGS.repo) / "config" / "master.cf").read_text())
    return create_agents(load_config(conf, hostname="relay.bench"))["smtp"]


async def _run(
    agent: Agent, qf: QueueFile, content: bytes, nexthop: str
) -> collections.Counter[tuple[str, str]]:
    outcomes: collections.Counter[tuple[str, str]] = collections.Counter()
    left = ARGS.m

    async def worker() -> None:
        nonlocal left
        while left > 0:
            left -= 1
            n = left
            request = DeliveryRequest(
                queue_id=f"B{n:010X}",
                transport="smtp",
                nexthop=nexthop,
                sender=qf.sender,
                recipients=(Recipient(f"r{n}@sink.test", 1000 + n),),
                content=QueueFileContent(qf.path, qf.content_offset, qf.content_size, data=content),
                cache_load=True,
                cache_store=True,
            )
            result = await agent.deliver(request)
            for r in result.recipients:
                outcomes[r.outcome.value, r.reply] += 1

    await asyncio.gather(*(worker() for _ in range(ARGS.inflight)))
    await agent.close()
    return outcomes


def main() -> None:
    """One line of results."""
    sink = tool("smtp-sink")
    if sink is None:
        raise SystemExit("smtp-sink not found (Debian's postfix package)")
    root = Path(tempfile.mkdtemp(prefix="clientpath-"))
    port = free_port()
    as_root = ["-u", "nobody"] if os.geteuid() == 0 else []  # smtp-sink refuses root
    proc = subprocess.Popen(
        [sink, *as_root, "-c", f"127.0.0.1:{port}", "1000"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_port(port, 30, proc)
        spool = Spool(root / "spool", fsync=False)
        spool.ensure_dirs()
        env = Envelope("s@bench.test", (RecipientSpec("r@sink.test"),), time.time())
        qid = spool.commit(env, _content(ARGS.size * 1024))
        qf = QueueFile.open(spool.path("incoming", qid))
        content = QueueFileContent.of(qf).read()
        output = configure_logging(maillog_file=root / "maillog", hostname="relay")
        agent = _agent(root, port)
        with asyncio.Runner(loop_factory=loop_factory()) as runner:
            cpu, wall = time.process_time(), time.monotonic()
            outcomes = runner.run(_run(agent, qf, content, f"[127.0.0.1]:{port}"))
            cpu, wall = time.process_time() - cpu, time.monotonic() - wall
        output.close()
    finally:
        proc.terminate()
        proc.wait(10)
        shutil.rmtree(root, ignore_errors=True)
    stats = getattr(agent, "stats", None)
    print(
        f"repo={ARGS.repo} m={ARGS.m} inflight={ARGS.inflight} size={ARGS.size}k "
        f"content={len(content)}B"
    )
    print(f"  agent: {stats}")
    for (outcome, reply), count in outcomes.most_common():
        print(f"  {count} x {outcome} {reply}")
    print(
        f"cpu ms/msg={1000 * cpu / ARGS.m:.3f}  wall={wall:.2f}s  loadavg={os.getloadavg()[0]:.1f}"
    )


if __name__ == "__main__":
    main()
