"""Fair admission into the active queue (qmgrd.core.admission) and the GCRA it paces with."""

from __future__ import annotations

from collections import Counter, deque

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from qmgrd.core.admission import Admission, FlowBacklog, FlowLimits
from qmgrd.core.flow import FLOW_NONE, Flow
from qmgrd.core.gcra import Gcra
from qmgrd.errors import InvariantError

A, B, C = Flow("sender_domain:a.test"), Flow("sender_domain:b.test"), Flow("sender_domain:c.test")


class PostfixOrder:
    """The admission order before fairness (MessageTable.next_waiting as it was): the reference."""

    def __init__(self) -> None:
        self.waiting: dict[str, deque[str]] = {"incoming": deque(), "deferred": deque()}
        self.prefer_incoming = True

    def add(self, queue_id: str, source: str) -> None:
        self.waiting[source].append(queue_id)

    def remove(self, queue_id: str) -> None:
        for fifo in self.waiting.values():
            if queue_id in fifo:
                fifo.remove(queue_id)

    def next(self, room: bool) -> tuple[str, str] | None:
        incoming, deferred = self.waiting["incoming"], self.waiting["deferred"]
        if not incoming and not deferred:
            return None
        if deferred and (not incoming or not self.prefer_incoming):
            queue_id, source = deferred.popleft(), "deferred"
        else:
            queue_id, source = incoming.popleft(), "incoming"
        self.prefer_incoming = source == "deferred" or not room
        return queue_id, source


_OPS = st.lists(
    st.one_of(
        st.tuples(st.just("add"), st.sampled_from(["incoming", "deferred"])),
        st.tuples(st.just("next"), st.booleans()),
        st.tuples(st.just("remove"), st.integers(0, 60)),
    ),
    max_size=120,
)


@given(_OPS)
@settings(max_examples=300, deadline=None)
def test_fairness_none_is_exactly_the_postfix_order(ops: list[tuple[str, object]]) -> None:
    """One flow (fairness none): every admission equals the old order, removals included."""
    adm, ref = Admission(), PostfixOrder()
    made = 0
    for op, arg in ops:
        if op == "add":
            queue_id = f"Q{made:04d}"
            made += 1
            adm.add(queue_id, str(arg), FLOW_NONE)
            ref.add(queue_id, str(arg))
        elif op == "remove":
            queue_id = f"Q{int(str(arg)):04d}"
            assert adm.remove(queue_id) == (queue_id in ref.waiting["incoming"]
                                            or queue_id in ref.waiting["deferred"])
            ref.remove(queue_id)
        else:
            got = adm.next(bool(arg), 0.0)
            want = ref.next(bool(arg))
            assert (got[:2] if got else None) == want
            if got is not None:
                adm.release(got[2])
    assert len(adm) == len(ref.waiting["incoming"]) + len(ref.waiting["deferred"])


def test_a_backlog_does_not_keep_another_flow_waiting() -> None:
    """B's message, queued behind 10,000 of A's, is admitted within two admissions."""
    adm = Admission()
    for i in range(10_000):
        adm.add(f"A{i}", "incoming", A)
    for _ in range(100):
        got = adm.next(True, 0.0)
        assert got is not None and got[2] is A
    adm.add("B0", "incoming", B)
    order = [adm.next(True, 0.0) for _ in range(2)]
    assert ("B0", "incoming", B) in order


def test_weighted_shares_stay_within_one_message_of_fair() -> None:
    """Weights 1/1/2: over any prefix, each flow's count is within 1 of its weighted share."""
    heavy = Flow("tenant:big", 2.0, "big")
    adm = Admission()
    for i in range(400):
        for flow in (A, B, heavy):
            adm.add(f"{flow.key}-{i}", "incoming", flow)
    counts: Counter[str] = Counter()
    for n in range(1, 401):
        got = adm.next(True, 0.0)
        assert got is not None
        counts[got[2].key] += 1
        for flow in (A, B, heavy):
            share = n * flow.weight / 4.0
            assert abs(counts[flow.key] - share) <= 1.0 + 1e-9, (n, dict(counts))
    assert counts[heavy.key] == 200


def test_an_idle_flow_that_wakes_is_served_within_one_round() -> None:
    """Three backlogged flows; a fourth that appears goes before any flow is served twice."""
    adm = Admission()
    for i in range(50):
        for flow in (A, B, C):
            adm.add(f"{flow.key}-{i}", "incoming", flow)
    for _ in range(30):
        adm.next(True, 0.0)
    late = Flow("sender_domain:late.test")
    adm.add("late", "incoming", late)
    round_ = [adm.next(True, 0.0) for _ in range(4)]
    assert ("late", "incoming", late) in round_


def test_incoming_and_deferred_alternate_inside_a_flow() -> None:
    """A flow's own incoming and deferred alternate as Postfix's feed does."""
    adm = Admission()
    for i in range(3):
        adm.add(f"i{i}", "incoming", A)
        adm.add(f"d{i}", "deferred", A)
    got = [adm.next(True, 0.0) for _ in range(6)]
    assert [g[0] for g in got if g] == ["i0", "d0", "i1", "d1", "i2", "d2"]


def test_active_limit_holds_a_flow_until_release() -> None:
    """With active_limit 2, A stops at 2 admitted while B goes on; a release lets A go again."""
    adm = Admission(FlowLimits(active_limit=2))
    for i in range(10):
        adm.add(f"A{i}", "incoming", A)
    for i in range(3):
        adm.add(f"B{i}", "incoming", B)
    got = [adm.next(True, 0.0) for _ in range(6)]
    ids = [g[0] for g in got if g]
    assert ids.count("A0") + ids.count("A1") == 2 and "A2" not in ids
    assert ids.count("B0") + ids.count("B1") == 2
    assert adm.next(True, 0.0) is None  # both flows at their cap
    adm.release(A)
    assert adm.next(True, 0.0) == ("A2", "incoming", A)


def test_rate_paces_a_flow_and_tells_when_it_may_go() -> None:
    """rate 2/s, burst 2: two at once, then one every 0.5 s; next_deadline says when."""
    adm = Admission(FlowLimits(rate=2.0, burst=2.0))
    for i in range(10):
        adm.add(f"A{i}", "incoming", A)
    adm.add("B0", "incoming", B)
    first = [adm.next(True, 10.0) for _ in range(4)]
    assert sorted(g[0] for g in first if g) == ["A0", "A1", "B0"]
    assert adm.next_deadline() == pytest.approx(10.5)
    assert adm.next(True, 10.4) is None
    assert adm.next(True, 10.5) == ("A2", "incoming", A)
    assert adm.next(True, 10.5) is None
    assert adm.next_deadline() == pytest.approx(11.0)


def test_backlog_limit_names_only_the_flow_over_it() -> None:
    """over_backlog is per flow: A with 3 waiting is over a limit of 3, B with 1 is not."""
    adm = Admission(FlowLimits(backlog_limit=3))
    for i in range(3):
        adm.add(f"A{i}", "incoming", A)
    adm.add("B0", "incoming", B)
    assert adm.over_backlog(A.key) and not adm.over_backlog(B.key)
    assert not adm.over_backlog("sender_domain:nobody.test")
    adm.next(True, 0.0)
    adm.next(True, 0.0)
    assert not adm.over_backlog(A.key)


def test_removed_ids_are_skipped_and_may_come_back() -> None:
    """remove is lazy but exact: a removed id is never admitted; re-added, it goes at its new
    place; a flow whose ids are all removed is forgotten."""
    adm = Admission()
    for i in range(4):
        adm.add(f"A{i}", "incoming", A)
    assert adm.remove("A1") and not adm.remove("A1")
    adm.add("A1", "incoming", A)
    got = [adm.next(True, 0.0) for _ in range(5)]
    assert [g[0] for g in got if g] == ["A0", "A2", "A3", "A1"]
    for g in got:
        if g:
            adm.release(g[2])
    adm.add("B0", "incoming", B)
    adm.remove("B0")
    assert adm.backlogs(5) == () and len(adm) == 0


def test_backlogs_show_the_top_flows_and_other() -> None:
    """Status rows: top N by waiting, the rest summed as 'other'."""
    adm = Admission()
    for flow, n in ((A, 5), (B, 3), (C, 1), (Flow("k:d", 1.0, "dee"), 1)):
        for i in range(n):
            adm.add(f"{flow.key}{i}", "incoming", flow)
    got = adm.next(True, 0.0)
    assert got is not None
    rows = adm.backlogs(2)
    assert rows[:2] == (FlowBacklog(A.label, 5 - (got[2] is A), int(got[2] is A)),
                        FlowBacklog(B.label, 3 - (got[2] is B), int(got[2] is B)))
    assert rows[2].label == "other" and rows[2].waiting + rows[2].active == 2


def test_misuse_is_an_invariant_error() -> None:
    """Double add, unknown source, release without admission: bugs, loud."""
    adm = Admission()
    adm.add("X", "incoming", A)
    with pytest.raises(InvariantError):
        adm.add("X", "deferred", A)
    with pytest.raises(InvariantError):
        adm.add("Y", "hold", A)
    with pytest.raises(InvariantError):
        adm.release(B)


def test_gcra_burst_then_sustained_rate() -> None:
    """GCRA: burst events at once, then one per interval; allowed_at is exact."""
    g = Gcra(rate=4.0, burst=3.0)
    for _ in range(3):
        assert g.conforms(0.0)
        g.take(0.0)
    assert not g.conforms(0.0)
    assert g.allowed_at(0.0) == pytest.approx(0.25)
    assert g.conforms(0.25)
    g.take(0.25)
    assert g.allowed_at(0.25) == pytest.approx(0.5)
    assert g.conforms(10.0)  # idle time refills the burst, no more
    for _ in range(3):
        g.take(10.0)
    assert not g.conforms(10.0)
    with pytest.raises(InvariantError):
        Gcra(rate=0.0)


_LIMITED_OPS = st.lists(
    st.one_of(
        st.tuples(st.just("add"), st.integers(0, 2), st.sampled_from(["incoming", "deferred"])),
        st.tuples(st.just("remove"), st.integers(0, 15), st.just("")),
        st.tuples(st.just("next"), st.booleans(), st.just("")),
        st.tuples(st.just("release"), st.integers(0, 40), st.just("")),
        st.tuples(st.just("tick"), st.integers(1, 5), st.just("")),
    ),
    max_size=150,
)


@given(
    _LIMITED_OPS,
    st.integers(0, 3),
    st.sampled_from([0.0, 0.5, 2.0]),
    st.integers(0, 4),
)
@settings(max_examples=300, deadline=None)
def test_with_limits_every_waiting_id_is_admitted_once_and_none_is_stuck(
    ops: list[tuple[str, int | bool, str]], cap: int, rate: float, backlog: int
) -> None:
    """Any mix of adds, removals, admissions, releases and time under per-flow limits: no id
    is admitted twice or after its removal, caps and counts hold, and once everything
    admitted is released and time passes, every id still waiting is admitted."""
    flows = [A, B, C]
    adm = Admission(FlowLimits(active_limit=cap, rate=rate, burst=2.0, backlog_limit=backlog))
    now = 0.0
    waiting: dict[str, Flow] = {}
    admitted: list[tuple[str, Flow]] = []
    seen: set[str] = set()
    made = 0

    def take(got: tuple[str, str, Flow] | None) -> None:
        if got is None:
            return
        queue_id, _source, flow = got
        assert waiting.pop(queue_id) is flow and queue_id not in seen
        seen.add(queue_id)
        admitted.append((queue_id, flow))
        if cap:
            assert sum(f is flow for _q, f in admitted) <= cap

    for op, arg, source in ops:
        if op == "add":
            queue_id = f"Q{made}"
            made += 1
            waiting[queue_id] = flows[int(arg)]
            adm.add(queue_id, source, flows[int(arg)])
        elif op == "remove":
            queue_id = f"Q{arg}"
            assert adm.remove(queue_id) == (waiting.pop(queue_id, None) is not None)
        elif op == "next":
            take(adm.next(bool(arg), now))
        elif op == "release" and admitted:
            _queue_id, flow = admitted.pop(int(arg) % len(admitted))
            adm.release(flow)
        elif op == "tick":
            now += float(arg)
        assert len(adm) == len(waiting)
        for flow in flows:
            count = sum(f is flow for f in waiting.values())
            assert adm.backlog(flow.key) == count
            assert adm.over_backlog(flow.key) == (backlog > 0 and count >= backlog)
    for _ in range(4 * len(waiting) + 4):
        while admitted:
            adm.release(admitted.pop()[1])
        deadline = adm.next_deadline()
        now = max(now, deadline) if deadline is not None else now
        take(adm.next(True, now))
    assert not waiting and len(adm) == 0
    assert adm.backlogs(3) == ()


def test_a_capped_flow_emptied_by_removal_is_admitted_again_later() -> None:
    """Regression: capped, its waiting ids removed, its admitted one released, then new mail:
    the flow must compete again (not stay held back with nothing left to release it)."""
    adm = Admission(FlowLimits(active_limit=1))
    adm.add("A0", "incoming", A)
    adm.add("A1", "incoming", A)
    first = adm.next(True, 0.0)
    assert first is not None and first[0] == "A0"
    assert adm.next(True, 0.0) is None  # capped
    adm.remove("A1")
    adm.release(A)
    adm.add("A2", "incoming", A)
    assert adm.next(True, 0.0) == ("A2", "incoming", A)
