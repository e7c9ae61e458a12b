"""Each listener worker's session cap, sessions and loop lag in the queue manager's /metrics."""

from __future__ import annotations

import asyncio
from pathlib import Path

from qmgrd.core.sessioncap import FLOOR
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
    """Two workers report a cap (at most smtpd_session_limit) and lag samples each; a worker
    whose loop stalls (SIGSTOP, longer than in_flow_lag_limit) records the lag in its own
    histogram and lowers its own cap to the floor; the other worker's histogram shows no such
    stall. (After a stall of 0.5 s or more the lag's moving average reads about 0.1 s, over
    the 60 ms limit.)"""
    async with _relay(
        tmp_path, 2, "smtpd_session_limit = 77\nin_flow_lag_limit = 60\n"
    ) as (relay, _sink):
        def reported() -> bool:
            caps = [relay.metric(_cap(w)) for w in (1, 2)]  # 77 unless the loop lagged already
            return all(1 <= cap <= 77 for cap in caps) and all(
                relay.metric(_lag_count(w)) > 0 for w in (1, 2)
            )

        await wait_until(reported, "both workers' caps and lag samples", TIMEOUT)
        await relay.send("counted")
        stalled = relay.proc.children()[0]  # the lower pid: slot 1, started first
        with _stopped([stalled]):
            await asyncio.sleep(1.5)  # not a wait: the stall the worker's loop lives through
        await wait_until(
            lambda: relay.metric(_cap(1)) == FLOOR, "the stalled worker's cap", TIMEOUT
        )
        for worker, stalls in ((1, True), (2, False)):  # samples over 1 s late: worker 1's only
            late = relay.metric(_lag_count(worker)) - relay.metric(_lag_over(worker, "1.0"))
            assert (late > 0) is stalls, (worker, late)
        assert relay.metric('qmgrd_smtpd_worker_sessions{worker="1"}') == 0
