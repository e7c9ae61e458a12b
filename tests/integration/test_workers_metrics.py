"""Each listener worker's session cap, sessions and loop lag in the queue manager's /metrics."""

from __future__ import annotations

import asyncio
from pathlib import Path

from tests.integration.test_workers import TIMEOUT, _relay, _stopped
from tests.support.waits import wait_until


def _cap(worker: int) -> str:
    return f'qmgrd_smtpd_worker_session_cap{{worker="{worker}"}}'


def _lag_count(worker: int) -> str:
    return f'qmgrd_smtpd_worker_event_loop_lag_seconds_count{{worker="{worker}"}}'


def _lag_over(worker: int, bound: str) -> str:
    """Samples of the worker's lag above ``bound`` seconds (a bucket of the histogram)."""
    return f'qmgrd_smtpd_worker_event_loop_lag_seconds_bucket{{le="{bound}",worker="{worker}"}}'


async def test_each_workers_session_cap_and_loop_lag_are_exported(tmp_path: Path) -> None:
    """Two workers report a cap (smtpd_session_limit at first) and lag samples each; a worker
    whose loop stalls (SIGSTOP, longer than in_flow_lag_limit) records the lag in its own
    histogram and lowers its own cap to the floor, the other worker's stays. (After a stall
    of 0.5 s or more the lag's moving average reads about 0.1 s, over the 60 ms limit.)"""
    async with _relay(
        tmp_path, 2, "smtpd_session_limit = 77\nin_flow_lag_limit = 60\n"
    ) as (relay, _sink):
        def reported() -> bool:
            caps = [relay.metric(_cap(w)) for w in (1, 2)]
            return caps == [77, 77] and all(relay.metric(_lag_count(w)) > 0 for w in (1, 2))

        await wait_until(reported, "both workers' caps and lag samples", TIMEOUT)
        await relay.send("counted")
        stalled = relay.proc.children()[0]  # the lower pid: slot 1, started first
        below = relay.metric(_lag_over(1, "0.5"))  # samples at most 0.5 s late so far
        with _stopped([stalled]):
            await asyncio.sleep(0.8)  # not a wait: the stall the worker's loop lives through
        await wait_until(lambda: relay.metric(_cap(1)) == 10, "the stalled worker's cap", TIMEOUT)
        total = relay.metric(_lag_count(1))
        assert total - relay.metric(_lag_over(1, "0.5")) > 0  # samples over 0.5 s late
        assert relay.metric(_lag_over(1, "0.5")) >= below
        assert relay.metric(_cap(2)) == 77
        assert relay.metric('qmgrd_smtpd_worker_sessions{worker="1"}') == 0
