"""Fair admission end to end over loopback: B's mail is not stuck behind A's backlog (issue 15).

The scenario is bench/fairness.py's, scaled down: A queued a 100-recipient list and 600
single-recipient messages; the active queue holds 40; B sends 8 messages over SMTP paced by
A's progress (events, no sleeps). The bound is on order, relative to the ``none`` run: how
many of A's messages reach the sink between B's commit and B's arrival. A loaded machine
changes the times, not that count.
"""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest

from bench.fairness import run_fairness

BACKLOG, LIST_RCPTS, B_MESSAGES, ACTIVE = 600, 100, 8, 40


@pytest.mark.slow
async def test_sender_domain_fairness_lets_b_past_a_backlog(tmp_path: Path) -> None:
    """none: B waits behind A's waiting backlog; sender_domain: B overtakes it and is
    passed only by what was already in core (at most about the active queue's size)."""
    runs = {}
    for key in ("none", "sender_domain"):
        runs[key] = await run_fairness(
            tmp_path / key,
            key,
            backlog=BACKLOG,
            list_rcpts=LIST_RCPTS,
            b_messages=B_MESSAGES,
            active_limit=ACTIVE,
        )
    none, fair = runs["none"], runs["sender_domain"]
    for run in (none, fair):
        assert len(run.b_latencies) == B_MESSAGES
        assert run.a_recipients == BACKLOG + LIST_RCPTS  # A lost nothing
    # none: B's first message is queued behind nearly all of A's backlog
    assert max(none.b_overtaken) >= BACKLOG // 2, none.b_overtaken
    # sender_domain: only what sat in the active queue (and in flight) goes first
    assert max(fair.b_overtaken) <= 2 * ACTIVE, fair.b_overtaken
    assert statistics.median(fair.b_overtaken) * 4 < statistics.median(none.b_overtaken)
    assert statistics.median(fair.b_latencies) < statistics.median(none.b_latencies)
