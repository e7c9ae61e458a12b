"""Delivery sequences of the preemptive scheduler (seed SCHEDULER_README 3.x, notes §5)."""

from __future__ import annotations

import pytest

from qmgrd.core import TransportParams
from tests.unit.core.schedsim import Sim, digits


def _serial(cost: int, loan: int, discount: int) -> TransportParams:
    """One delivery at a time, one recipient per entry."""
    return TransportParams(
        process_limit=1,
        destination_recipient_limit=1,
        delivery_slot_cost=cost,
        delivery_slot_loan=loan,
        delivery_slot_discount=discount,
    )


def _seed_run(params: TransportParams) -> str:
    sim = Sim({"smtp": params})
    sim.add("1", [("smtp", "example.com")] * 10, queued_time=100.0)
    sim.add("2", [("smtp", "example.com")] * 2, queued_time=100.0)
    sim.add("3", [("smtp", "example.com")] * 2, queued_time=100.0)
    return digits(sim.run_serial())


def test_seed_sequence_cost2_no_loan() -> None:
    """Cost 2, loan 0, discount 0 gives the seed's 11112211113311.

    Timing pinned: all three messages are in core before the first selection (the seed's
    example starts from that state); each selection is completed before the next one.
    """
    assert _seed_run(_serial(2, 0, 0)) == "11112211113311"


def test_seed_sequence_cost2_discount50() -> None:
    """Cost 2, loan 0, discount 50 gives the seed's 11221111331111 (same timing as above)."""
    assert _seed_run(_serial(2, 0, 50)) == "11221111331111"


def test_seed_sequence_small_messages_arrive_after_first_delivery() -> None:
    """The seed strings do not depend on the small messages being in core before slot 1.

    They only need to be linked before the 10-entry job has earned its first preemption.
    """
    for params, want in (
        (_serial(2, 0, 0), "11112211113311"),
        (_serial(2, 0, 50), "11221111331111"),
    ):
        sim = Sim({"smtp": params})
        sim.add("1", [("smtp", "example.com")] * 10, queued_time=100.0)
        first = sim.sched.select(sim.now)
        assert first is not None
        sim.sched.entry_done(first, now=sim.now)
        sim.add("2", [("smtp", "example.com")] * 2, queued_time=101.0)
        sim.add("3", [("smtp", "example.com")] * 2, queued_time=101.0)
        assert digits([first, *sim.run_serial()]) == want


# (description with the derivation, params, messages [(qid, entries, queued_time)], expected)
# Notation: a = slots_available of the big job before a selection; the preempt test is
# a // cost + loan >= expected * (100 - discount) / 100.
SEQUENCES = [
    (
        "cost 1 disables preemption: plain FIFO by queued_time",
        _serial(1, 0, 0),
        [("1", 10, 100.0), ("2", 2, 100.0), ("3", 2, 100.0)],
        "11111111112233",
    ),
    (
        "defaults 5/3/50: at a=1, 0+3 >= 2*0.5 so job 2 goes at once and costs 10 (a=-9); "
        "job 1 earns a=1 after 10 more, then job 3 goes; 9 left",
        _serial(5, 3, 50),
        [("1", 20, 100.0), ("2", 2, 100.0), ("3", 2, 100.0)],
        "1" + "22" + "1" * 10 + "33" + "1" * 9,
    ),
    (
        "defaults: a job of 14 entries (< minimum_delivery_slots 3 * cost 5) is never preempted",
        _serial(5, 3, 50),
        [("1", 14, 100.0), ("2", 1, 100.0)],
        "1" * 14 + "2",
    ),
    (
        "cost 5, loan 0, discount 50: job 2 needs a//5 >= 1 (a=5), then a=-5; job 3 needs "
        "a//5 >= 2 (a=10), which job 1's last 15 entries only reach when it is done",
        _serial(5, 0, 50),
        [("1", 20, 100.0), ("2", 2, 100.0), ("3", 4, 100.0)],
        "11111" + "22" + "1" * 15 + "3333",
    ),
    (
        "score age/total entries: equal age, job 3 (2 entries) beats job 2 (4 entries) at a=4; "
        "afterwards max_slots = (10-4+0)//2 = 3 < 4 so job 2 waits for job 1 to finish",
        _serial(2, 0, 0),
        [("1", 10, 100.0), ("2", 4, 100.0), ("3", 2, 100.0)],
        "1111" + "33" + "111111" + "2222",
    ),
    (
        "the candidate reachable with the most slots: job 3 (2) at a=4, then job 2 (8) once "
        "a//2 >= 8, i.e. 16 more entries of job 1",
        _serial(2, 0, 0),
        [("1", 30, 100.0), ("2", 8, 100.0), ("3", 2, 100.0)],
        "1111" + "33" + "1" * 16 + "2" * 8 + "1" * 10,
    ),
]


@pytest.mark.parametrize(
    ("desc", "params", "messages", "want"),
    SEQUENCES,
    ids=[f"row{i}" for i in range(len(SEQUENCES))],
)
def test_sequence_table(
    desc: str, params: TransportParams, messages: list[tuple[str, int, float]], want: str
) -> None:
    """Each row's delivery sequence follows from the preempt inequality (see the row text)."""
    sim = Sim({"smtp": params})
    for qid, n, qtime in messages:
        sim.add(qid, [("smtp", "example.com")] * n, queued_time=qtime)
    assert digits(sim.run_serial()) == want, desc
