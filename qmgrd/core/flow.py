"""Flows: who a message belongs to, for fair queuing (seed: APF queueset; DESIGN §10).

Contract
--------
A :class:`Flow` is a frozen value the engine computes once per message from its envelope and the
fairness settings (``qmgrd.daemon.flows``) and hands to the core. The core never computes a flow
itself: it only compares keys and uses the weight. ``FLOW_NONE`` (key ``""``, weight 1) is the
flow of every message when fairness is ``none``; with it the schedules are exactly Postfix's.

``key`` identifies the flow (for example ``sender_domain:example.org``); ``weight`` (> 0) is its
share relative to other backlogged flows; ``tenant`` is an optional name for reports and metrics
(empty: the key is shown).
"""

from __future__ import annotations

from dataclasses import dataclass

from qmgrd.errors import InvariantError

__all__ = ["FLOW_NONE", "Flow"]


@dataclass(frozen=True, slots=True)
class Flow:
    """One flow's identity and weight."""

    key: str
    weight: float = 1.0
    tenant: str = ""

    def __post_init__(self) -> None:
        if not self.weight > 0.0:
            raise InvariantError(f"flow {self.key!r}: weight {self.weight} is not positive")

    @property
    def label(self) -> str:
        """What status and metrics show: the tenant name, else the key (``none`` for no key)."""
        return self.tenant or self.key or "none"


FLOW_NONE = Flow("")
