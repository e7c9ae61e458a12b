"""What the engine's parts share: collaborators, the message table, counters, task spawning.

Contract
--------
:class:`EngineContext` is built once by ``Engine`` and handed to each part
(loading, dispatch, outcomes, finishing, operations). It holds the
collaborators (settings, spool, scheduler, resolver, agents, clock, file-work
batcher), the :class:`~qmgrd.daemon.table.MessageTable`, the counters and two
callbacks into the loop: ``spawn(coro, delivery=False)`` starts a task the
loop supervises (a failure in it is a bug and stops the daemon, see
``qmgrd.daemon.engine``) and ``kick()`` makes the loop run a pass. Reload
replaces ``settings``, ``resolver``, ``transport_params``, ``agents`` and
``fairness`` in place; every part reads them through the context, so no part keeps a stale
copy.

Parts never call each other's private methods: the loop (``engine``) wires
them by passing bound methods where one part needs another.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from qmgrd.core.flow import Flow
from qmgrd.core.params import TransportParams
from qmgrd.core.resolve import Resolver
from qmgrd.core.scheduler import Scheduler
from qmgrd.daemon.clock import Clock
from qmgrd.daemon.flows import FairnessSettings, FlowEnvelope
from qmgrd.daemon.iobatch import IoBatcher
from qmgrd.daemon.settings import EngineSettings
from qmgrd.daemon.table import MessageTable
from qmgrd.delivery.agent import Agent
from qmgrd.log import LineLog, get_logger
from qmgrd.spool import Spool

if TYPE_CHECKING:
    from qmgrd.daemon.destgate import DestGate

__all__ = ["DeliveryObserver", "EngineContext", "EngineStats", "Spawn"]

RETRY_DELAY = 5.0  # seconds before file work that failed (disk full, EIO) is tried again


class DeliveryObserver(Protocol):
    """Where the engine reports outcomes for metrics (``qmgrd.daemon.metrics.Metrics``)."""

    def record_delivery(
        self, transport: str, status: str, dsn: str, seconds: float, count: int = 1
    ) -> None:
        """``count`` recipient outcomes (one status and DSN); ``seconds`` since the message
        arrived."""
        ...

    def record_attempt(self, transport: str, seconds: float) -> None:
        """One delivery attempt took ``seconds``."""
        ...


@dataclass(slots=True)
class EngineStats:
    """Counters for status, metrics and benchmarks."""

    messages_loaded: int = 0
    messages_removed: int = 0
    messages_deferred: int = 0
    messages_bounced: int = 0
    recipients_sent: int = 0
    recipients_deferred: int = 0
    recipients_bounced: int = 0
    deliveries: int = 0


class Spawn(Protocol):
    """Start a supervised task (``delivery``: counted among deliveries for shutdown)."""

    def __call__(
        self, coro: Coroutine[Any, Any, None], *, delivery: bool = False
    ) -> None: ...


@dataclass(slots=True, eq=False)
class EngineContext:
    """The engine's shared state and collaborators (see the module doc)."""

    settings: EngineSettings
    spool: Spool
    scheduler: Scheduler
    resolver: Resolver
    transport_params: Callable[[str], TransportParams]
    agents: dict[str, Agent]
    clock: Clock
    io: IoBatcher
    spawn: Spawn
    kick: Callable[[], None]
    table: MessageTable = field(default_factory=MessageTable)
    stats: EngineStats = field(default_factory=EngineStats)
    metrics: DeliveryObserver | None = None
    fairness: FairnessSettings = field(default_factory=FairnessSettings)  # flows of new messages
    incoming_moved: Callable[[], None] = lambda: None  # regulator: in_flow_delay tokens
    retry_delay: float = RETRY_DELAY
    stopping: bool = False
    admit_flow: Callable[[FlowEnvelope], Flow] | None = None  # None: fairness none (admitting)
    log: Any = field(default_factory=lambda: LineLog(get_logger("qmgr")))
    smtp_log: Any = field(default_factory=lambda: LineLog(get_logger("smtp")))
    gate: DestGate | None = None  # cluster: shared destination state (qmgrd.daemon.destgate)
