"""The seed's "active server concurrency limiter" experiment, end to end over loopback.

    .venv/bin/python bench/limiter.py                       # 3 feedbacks, learning off (and on)
    .venv/bin/python bench/limiter.py -n 600 --delay 0.03 --feedback 1/sqrt_concurrency

The seed SCHEDULER_README measured a client with destination concurrency limit 20 and initial
concurrency 5 sending to a server that admits 5 concurrent sessions and answers every further one
with ``421`` and a hang-up: 1/concurrency deferred 16.5 %, 1/sqrt_concurrency 24.5 %, constant 1
49.7 % of the first delivery attempts.

Here the daemon is the one ``qmgrd run`` runs (``tests.integration.e2e.start_daemon``, in this
process, no fsync), the server an aiosmtpd sink on 127.0.0.1 (``tests.integration.sinks``) with
``max_sessions = 5`` and ``delay`` seconds before each MAIL, RCPT and end-of-DATA reply, so that a
delivery lasts much longer than a refused connection (the seed's 1 s deliveries). N
single-recipient messages are queued in ``incoming/`` before the daemon starts; the retry times
are an hour, so every deferred recipient stays deferred: the deferred fraction is the share of
first attempts that were deferred. Connection caching is switched off (the sink counts idle cached
sessions as occupying a server slot, which the seed's table shows makes no difference).

It first prints the same experiment in simulation (tests/unit/core/limitersim.py: the real
scheduler, learning off and on), then end to end: a baseline with feedback 0 (the window stays at
5: the sink's capacity in msg/s), each feedback with ``default_destination_concurrency_learning =
no``, and with ``--learning`` with ``yes`` (the engine hands throttled results to
``Scheduler.entry_throttled``, docs/limiter.md).
``run_limiter`` is what tests/integration/test_limiter_e2e.py calls.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import structlog.testing

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.integration.e2e import commit, offline_spool, start_daemon  # noqa: E402
from tests.integration.sinks import SinkConfig, SinkServer  # noqa: E402
from tests.support.config import write_config  # noqa: E402
from tests.unit.core.limitersim import run_limiter_sim  # noqa: E402

FEEDBACKS = ("1/concurrency", "1/sqrt_concurrency", "1")
SEED = {"1/concurrency": 0.165, "1/sqrt_concurrency": 0.245, "1": 0.497}
SERVER_LIMIT = 5


@dataclass(frozen=True, slots=True)
class LimiterRun:
    """What one run measured."""

    feedback: str
    learning: bool
    sent: int
    deferred: int
    refused: int  # connections the sink answered with 421
    peak: int  # most concurrent sessions the sink saw
    seconds: float

    @property
    def deferred_fraction(self) -> float:
        """Deferred recipients over all recipients (each had exactly one attempt)."""
        total = self.sent + self.deferred
        return self.deferred / total if total else 0.0


async def run_limiter(
    root: Path,
    feedback: str,
    *,
    messages: int = 400,
    delay: float = 0.03,
    jitter: float = 0.5,
    learning: bool = False,
    cohort_limit: int = 1,
    timeout: float = 240.0,
) -> LimiterRun:
    """Run the experiment once in ``root`` (a fresh directory) and return the counts."""
    loop = asyncio.get_running_loop()
    sink = SinkServer(
        SinkConfig(max_sessions=SERVER_LIMIT, delay=delay, delay_jitter=jitter * delay)
    )
    await sink.start()
    try:
        main = (
            f"relayhost = {sink.nexthop}\n"
            "default_destination_concurrency_limit = 20\n"
            "initial_destination_concurrency = 5\n"
            f"default_destination_concurrency_positive_feedback = {feedback}\n"
            f"default_destination_concurrency_negative_feedback = {feedback}\n"
            f"default_destination_concurrency_failed_cohort_limit = {cohort_limit}\n"
            "smtp_connection_cache_on_demand = no\n"
            "minimal_backoff_time = 3600s\n"
            "maximal_backoff_time = 3600s\n"
            "queue_run_delay = 3600s\n"
        )
        main += f"default_destination_concurrency_learning = {'yes' if learning else 'no'}\n"
        conf = write_config(root, main)
        spool = offline_spool(conf)
        now = time.time()  # wall clock: the queue file's arrival time
        for i in range(messages):
            commit(spool, "s@src.test", [f"r{i}@dst.test"], arrival_time=now)
        started = loop.time()
        daemon = await start_daemon(conf, listen=False)
        try:
            await daemon.wait_idle(timeout)
            seconds = loop.time() - started
            stats = daemon.engine.stats
            return LimiterRun(
                feedback,
                learning,
                stats.recipients_sent,
                stats.recipients_deferred,
                sink.refused,
                sink.peak,
                seconds,
            )
        finally:
            await daemon.stop()
    finally:
        await sink.stop()


async def _main(args: argparse.Namespace) -> None:
    with structlog.testing.capture_logs():  # the daemon's log lines are not the output
        await _table(args)


async def _table(args: argparse.Namespace) -> None:
    feedbacks = args.feedback or FEEDBACKS
    print(f"server admits {SERVER_LIMIT} sessions (421 beyond); client limit 20, initial 5")
    print(
        f"\nsimulation (tests/unit/core/limitersim.py, {args.sim_n} messages, +/-50 % service time)"
    )
    print(
        f"{'feedback':<20} {'learning':<9} {'deferred':>9} {'seed':>6} {'refused':>8} "
        f"{'sessions':>9}"
    )
    for learning in (False, True):
        for feedback in feedbacks:
            sim = run_limiter_sim(feedback, learning=learning, messages=args.sim_n)
            print(
                f"{feedback:<20} {'on' if learning else 'off':<9} "
                f"{100 * sim.deferred_fraction:>8.1f}% {100 * SEED[feedback]:>5.1f}% "
                f"{sim.refused:>8} {sim.mean_sessions:>9.2f}",
                flush=True,
            )
    print(
        f"\nend to end over loopback ({args.n} messages, {args.delay}s "
        f"+/-{100 * args.jitter:.0f} % per MAIL/RCPT/DOT)"
    )
    print(
        f"{'feedback':<20} {'learning':<9} {'deferred':>9} {'seed':>6} {'refused':>8} "
        f"{'peak':>5} {'msg/s':>7}"
    )
    rows: list[tuple[str, bool]] = [("0", False)]  # window fixed at 5: the sink's capacity
    rows += [(feedback, False) for feedback in feedbacks]
    if args.learning:
        rows += [(feedback, True) for feedback in feedbacks]
    for feedback, learning in rows:
        with tempfile.TemporaryDirectory(prefix="qmgrd-limiter-") as tmp:
            run = await run_limiter(
                Path(tmp),
                feedback,
                messages=args.n,
                delay=args.delay,
                jitter=args.jitter,
                learning=learning,
            )
        rate = run.sent / run.seconds if run.seconds else 0.0
        seed = f"{100 * SEED[feedback]:>5.1f}%" if feedback in SEED else f"{'-':>6}"
        print(
            f"{feedback:<20} {'on' if learning else 'off':<9} "
            f"{100 * run.deferred_fraction:>8.1f}% {seed} "
            f"{run.refused:>8} {run.peak:>5} {rate:>7.1f}",
            flush=True,
        )


def main() -> None:
    """Command line entry point (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=400, help="messages per run")
    parser.add_argument("--delay", type=float, default=0.03, help="sink delay per command")
    parser.add_argument("--jitter", type=float, default=0.5, help="delay +/- this fraction")
    parser.add_argument("--feedback", action="append", choices=FEEDBACKS)
    parser.add_argument("--learning", action="store_true", help="also run with learning on")
    parser.add_argument("--sim-n", type=int, default=3000, help="messages per simulated run")
    asyncio.run(_main(parser.parse_args()))


if __name__ == "__main__":
    main()
