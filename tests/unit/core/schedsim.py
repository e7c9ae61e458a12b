"""A tiny in-memory engine for scheduler tests: queue files as lists, a fake clock, no I/O."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from qmgrd.core import (
    Entry,
    Event,
    Message,
    ResolvedRecipient,
    Scheduler,
    SchedulerParams,
    TransportParams,
)
from qmgrd.core.flow import FLOW_NONE, Flow


@dataclass
class Sim:
    """Drives a Scheduler the way the engine does: serves reads, delivers, drains events."""

    tparams: dict[str, TransportParams]
    sparams: SchedulerParams = field(default_factory=SchedulerParams)
    now: float = 1000.0
    files: dict[str, list[ResolvedRecipient]] = field(default_factory=dict)
    events: list[Event] = field(default_factory=list)
    sched: Scheduler = field(init=False)

    def __post_init__(self) -> None:
        """Build the scheduler; unknown transports get the defaults."""
        self.sched = Scheduler(self.sparams, self._params)

    def _params(self, name: str) -> TransportParams:
        return self.tparams.get(name, TransportParams())

    def add(
        self,
        qid: str,
        rcpts: Sequence[tuple[str, str]],
        *,
        queued_time: float | None = None,
        serve: bool = True,
        single_rcpt: bool = False,
        flow: Flow = FLOW_NONE,
    ) -> Message:
        """Put a message with (transport, queue) recipients in core; serve its reads."""
        self.files[qid] = [
            ResolvedRecipient(f"u{i}@{q}", i + 1, t, q, q, payload=(qid, i))
            for i, (t, q) in enumerate(rcpts)
        ]
        msg = self.sched.message_create(
            qid,
            queued_time=self.now if queued_time is None else queued_time,
            rcpt_unread=len(rcpts),
            single_rcpt=single_rcpt,
            flow=flow,
        )
        if serve:
            self.serve_reads()
        return msg

    def serve_reads(self, pick: Callable[[int], int] | None = None) -> int:
        """Answer every pending read request; returns how many were served."""
        served = 0
        for req in self.sched.pop_reads():
            rcpts = self.files[req.message.queue_id]
            start = req.offset
            batch = rcpts[start : start + req.limit]
            end = start + len(batch)
            nxt = end if end < len(rcpts) else 0
            self.sched.recipients_add(req.message, batch, nxt, self.now)
            served += 1
        self.drain_events()
        return served

    def drain_events(self) -> list[Event]:
        """Move new scheduler events to ``events``."""
        new = self.sched.pop_events()
        self.events.extend(new)
        return new

    def select_all(self) -> list[Entry]:
        """Every entry ``select`` hands out now (BUSY, not completed)."""
        out = []
        while (entry := self.sched.select(self.now)) is not None:
            out.append(entry)
        return out

    def run_serial(
        self,
        max_steps: int = 10000,
        outcome: Callable[[Entry], tuple[str, str] | None] | None = None,
    ) -> list[Entry]:
        """Select, then complete, one entry at a time (process limit 1 style)."""
        done: list[Entry] = []
        for _ in range(max_steps):
            self.serve_reads()
            entry = self.sched.select(self.now)
            if entry is None:
                if self.serve_reads():
                    continue
                break
            hop = outcome(entry) if outcome else None
            self.sched.entry_done(entry, hop_failure=hop, now=self.now)
            self.now += 1.0
            done.append(entry)
        self.serve_reads()
        return done


def digits(entries: Sequence[Entry]) -> str:
    """The delivery sequence: the queue id of the message that got each slot."""
    return "".join(e.message.queue_id for e in entries)
