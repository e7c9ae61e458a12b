"""``FakeAgent``: a delivery agent for engine tests, with no network.

It answers each recipient by ``rule(address)`` (sent by default), reports
``hop(request)`` as the hop status, reads the whole content as a real agent
does and records what it was asked: ``requests`` (at the start of each
delivery), ``contents`` (one per request, same order) and ``delivered``
(queue id, address) for each recipient sent. With a ``gate`` every delivery
waits until ``release()`` opens the gate before answering (a stalled server);
``wait_started(n)`` waits, on an event, until ``n`` deliveries have started.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field

from qmgrd.delivery.agent import (
    DeliveryRequest,
    DeliveryResult,
    HopStatus,
    Outcome,
    RecipientResult,
)
from tests.support.waits import TIMEOUT, Changes

Verdict = tuple[Outcome, str, str]  # outcome, DSN code, remote reply


def always_sent(_address: str) -> Verdict:
    """The default rule: every recipient accepted."""
    return Outcome.SENT, "2.0.0", "250 2.0.0 Ok"


def no_hop(_request: DeliveryRequest) -> HopStatus | None:
    """The default hop status: none (the destination is healthy)."""
    return None


@dataclass(eq=False)
class FakeAgent:
    """An agent that answers from a rule and records what it was asked to deliver."""

    rule: Callable[[str], Verdict] = always_sent
    hop: Callable[[DeliveryRequest], HopStatus | None] = no_hop
    gate: asyncio.Event | None = None
    requests: list[DeliveryRequest] = field(default_factory=list)
    contents: list[bytes] = field(default_factory=list)
    delivered: list[tuple[str, str]] = field(default_factory=list)  # (queue_id, address)
    changes: Changes = field(default_factory=Changes)

    async def deliver(self, request: DeliveryRequest) -> DeliveryResult:
        """Wait at the gate (if any), read the content, answer every recipient by the rule."""
        self.requests.append(request)
        self.changes.notify()
        if self.gate is not None:
            await self.gate.wait()
        content = b"".join([chunk async for chunk in request.content.chunks()])
        assert content
        self.contents.append(content)
        results = []
        for r in request.recipients:
            outcome, dsn, reply = self.rule(r.address)
            if outcome is Outcome.SENT:
                self.delivered.append((request.queue_id, r.address))
            results.append(RecipientResult(r, outcome, dsn, reply, "sink[127.0.0.1]:25"))
        self.changes.notify()
        return DeliveryResult(tuple(results), self.hop(request))

    async def close(self) -> None:
        """Nothing to release."""

    def release(self) -> None:
        """Open the gate: stalled deliveries (and every later one) proceed."""
        assert self.gate is not None, "this agent has no gate"
        self.gate.set()

    async def wait_started(self, count: int, timeout: float = TIMEOUT) -> None:
        """Return once ``count`` deliveries have started (bounded)."""
        await self.changes.wait_for(
            lambda: len(self.requests) >= count, f"{count} deliveries to start", timeout
        )


def stalled_agent() -> FakeAgent:
    """A ``FakeAgent`` whose deliveries wait until ``agent.release()``."""
    return FakeAgent(gate=asyncio.Event())
