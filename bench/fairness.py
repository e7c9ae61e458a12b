"""Fair admission end to end: one sender's backlog against another sender's trickle (issue 15).

    .venv/bin/python bench/fairness.py                 # 2,000-message backlog, both keys
    .venv/bin/python bench/fairness.py -n 5000 --list-rcpts 1000

Scenario (the issue's "small-message delay behind the list", scaled down): sender A
(``a@a.test``) has queued a message with ``--list-rcpts`` recipients and then ``-n``
single-recipient messages in ``incoming/`` before the daemon starts; the active queue holds
``--active-limit`` messages (``qmgr_message_active_limit``), so most of A's backlog waits to
be loaded. While A's mail drains to an aiosmtpd sink on 127.0.0.1, sender B (``b@b.test``)
sends ``--b-messages`` single-recipient messages over SMTP, one each time the sink has
received another ``n / (b + 5)`` of A's messages (paced by A's progress, not by a timer; at
a few hundred messages/s that is one every ~100 ms).

For each ``default_fairness_key`` (``none``: Postfix's order; ``sender_domain``) it prints
B's latency (SMTP commit to the sink, p50 / p99 / max), how many of A's messages reached
the sink between B's commit and B's arrival ("overtaken by", p99 / max), and A's
throughput (A's recipients per second from the daemon's start to A's last delivery), also
for a run without B. The daemon is the one ``qmgrd run`` runs
(``tests.integration.e2e.start_daemon``, in this process, no fsync). Numbers depend on the
machine's load; nothing is asserted here (tests/integration/test_fair_admission_e2e.py
asserts the ordering).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import structlog.testing

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.integration.e2e import commit, offline_spool, start_daemon
from tests.integration.sinks import SinkServer
from tests.support.config import write_config

A_SENDER, B_SENDER = "a@a.test", "b@b.test"


@dataclass(slots=True)
class FairnessRun:
    """What one run measured."""

    key: str
    with_b: bool
    a_recipients: int = 0
    a_seconds: float = 0.0  # daemon start to A's last delivery
    b_latencies: list[float] = field(default_factory=list)  # seconds, commit to sink
    b_overtaken: list[int] = field(default_factory=list)  # A messages delivered meanwhile

    @property
    def a_rate(self) -> float:
        """A's recipients per second."""
        return self.a_recipients / self.a_seconds if self.a_seconds else 0.0


def quantile(values: list[float], q: float) -> float:
    """The ``q`` quantile (nearest rank) of ``values``; 0 for none."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered)) - 1))]


async def run_fairness(
    root: Path,
    key: str,
    *,
    backlog: int = 2000,
    list_rcpts: int = 200,
    b_messages: int = 20,
    with_b: bool = True,
    active_limit: int = 100,
    timeout: float = 300.0,
) -> FairnessRun:
    """Run the scenario once in ``root`` (a fresh directory); see the module doc."""
    loop = asyncio.get_running_loop()
    sink = SinkServer()
    await sink.start()
    run = FairnessRun(key, with_b)
    arrivals: list[float] = []  # loop time at which sink.messages[i] was seen
    a_seen = 0  # A messages at the sink, as the watcher counted them

    async def watch() -> None:
        nonlocal a_seen
        while True:
            await sink.wait_for(lambda: len(sink.messages) > len(arrivals), "a message", timeout)
            now = loop.time()
            for msg in sink.messages[len(arrivals) :]:
                arrivals.append(now)
                a_seen += msg.mail_from == A_SENDER

    def _reached(target: int) -> Callable[[], bool]:
        return lambda: a_seen >= target

    try:
        main = (
            f"relayhost = {sink.nexthop}\n"
            f"qmgr_message_active_limit = {active_limit}\n"
            f"default_fairness_key = {key}\n"
            "queue_run_delay = 3600s\n"
        )
        conf = write_config(root, main)
        spool = offline_spool(conf)
        now = time.time()
        commit(spool, A_SENDER, [f"list{i}@dst.test" for i in range(list_rcpts)],
               arrival_time=now)
        for i in range(backlog):
            commit(spool, A_SENDER, [f"a{i}@dst.test"], arrival_time=now)
        a_messages = backlog + (list_rcpts + 49) // 50  # the list goes in 50-recipient batches
        watcher = asyncio.create_task(watch())
        started = loop.time()
        daemon = await start_daemon(conf)
        try:
            sent: dict[str, tuple[float, int]] = {}  # B recipient -> (commit time, A seen)
            if with_b:
                step = max(1, backlog // (b_messages + 5))
                for i in range(b_messages):
                    target = (i + 1) * step
                    await sink.wait_for(_reached(target), f"{target} of A", timeout)
                    rcpt = f"b{i}@dst.test"
                    await daemon.submit(B_SENDER, [rcpt])
                    sent[rcpt] = (loop.time(), a_seen)
            await daemon.wait_idle(timeout)
            await sink.wait_for(lambda: len(arrivals) == len(sink.messages), "watcher", timeout)
        finally:
            await daemon.stop()
            watcher.cancel()
        last_a = 0.0
        a_count = 0
        for msg, at in zip(sink.messages, arrivals, strict=True):
            if msg.mail_from == A_SENDER:
                a_count += 1
                run.a_recipients += len(msg.rcpt_tos)
                last_a = at
            elif msg.mail_from == B_SENDER:
                committed, a_then = sent[msg.rcpt_tos[0]]
                run.b_latencies.append(at - committed)
                run.b_overtaken.append(a_count - a_then)
        run.a_seconds = last_a - started
        if a_count < backlog:
            raise AssertionError(f"only {a_count} of A's {a_messages} deliveries reached the sink")
        return run
    finally:
        await sink.stop()


def _line(run: FairnessRun, base: FairnessRun | None) -> str:
    ms = [1000 * x for x in run.b_latencies]
    over = [float(x) for x in run.b_overtaken]
    share = f" ({100 * run.a_rate / base.a_rate:5.1f} % of the run without B)" if base else ""
    b_part = (
        f"B latency ms p50={quantile(ms, 0.5):7.1f} p99={quantile(ms, 0.99):7.1f} "
        f"max={max(ms):7.1f}; overtaken by A p99={quantile(over, 0.99):5.0f} "
        f"max={max(over):5.0f}; "
        if ms
        else "no B; "
    )
    return f"key={run.key:<14} {b_part}A rate={run.a_rate:7.1f} rcpt/s{share}"


async def _main(args: argparse.Namespace) -> None:
    with structlog.testing.capture_logs():  # the daemon's log lines are not the output
        print(
            f"A: {args.n} single-recipient messages + 1 x {args.list_rcpts} recipients queued; "
            f"B: {args.b_messages} messages paced by A's progress; "
            f"qmgr_message_active_limit={args.active_limit}"
        )
        for key in args.key or ("none", "sender_domain"):
            runs: list[FairnessRun] = []
            for with_b in (False, True):
                with tempfile.TemporaryDirectory(prefix="qmgrd-fairness-") as tmp:
                    runs.append(
                        await run_fairness(
                            Path(tmp),
                            key,
                            backlog=args.n,
                            list_rcpts=args.list_rcpts,
                            b_messages=args.b_messages,
                            with_b=with_b,
                            active_limit=args.active_limit,
                        )
                    )
            print(_line(runs[0], None), flush=True)
            print(_line(runs[1], runs[0]), flush=True)
            if runs[1].b_latencies:
                interval = runs[1].a_seconds / (args.b_messages + 5)
                print(f"  (B sent about every {1000 * interval:.0f} ms; "
                      f"mean B latency {1000 * statistics.mean(runs[1].b_latencies):.1f} ms)")


def main() -> None:
    """Command line entry point (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=2000, help="A's single-recipient messages")
    parser.add_argument("--list-rcpts", type=int, default=200, help="recipients of A's list")
    parser.add_argument("--b-messages", type=int, default=20, help="B's messages")
    parser.add_argument("--active-limit", type=int, default=100,
                        help="qmgr_message_active_limit")
    parser.add_argument("--key", action="append", choices=("none", "sender_domain"))
    asyncio.run(_main(parser.parse_args()))


if __name__ == "__main__":
    main()
