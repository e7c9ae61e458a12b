"""Fair admission's daemon side: settings, the flows of waiting files, the intake gate.

Contract (issue 15; docs/fairness-admission.md)
-----------------------------------------------
- :func:`admission_settings` reads the fair-admission parameters (one block in
  ``qmgrd.config.params``) and the fairness key (``default_fairness_key``,
  ``fairness_weight_maps``: ``qmgrd.daemon.flows``) into
  :class:`AdmissionSettings`; ``Engine.configure_admission`` applies them at
  start and on reload.
- The flow of a waiting file is known without reading the file when the
  listener names it (``FlowGate.committed``); otherwise (start-up scan,
  deferred scans, pickup, notices, requeue) :func:`read_flow_facts` reads the
  envelope head of each file (``QueueFile.open``: the records before the
  recipients, bounded, never the recipients or the content) in a worker
  thread, in chunks of :data:`HEAD_CHUNK`, and the flows are computed on the
  loop (the weight tables are not shared with threads). With fairness
  ``none`` nothing is read: every message is ``FLOW_NONE``.
- A file whose head cannot be read gets ``FLOW_NONE``: its load then decides
  (vanished: forgotten; corrupt: ``corrupt/``; a system error: retried).
- :class:`EngineFlowGate` is the daemon's ``FlowGate`` (in-process): it
  refuses MAIL FROM with ``452 4.3.2`` for a flow that has
  ``qmgr_flow_backlog_limit`` messages waiting, and hands a committed
  message's facts to the engine. It never raises: a flow that cannot be
  computed is accepted (logged once per reason).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from qmgrd.config import Config
from qmgrd.core.admission import FlowLimits
from qmgrd.core.flow import FLOW_NONE, Flow
from qmgrd.daemon.flows import FairnessSettings, FlowEnvelope, fairness_settings, flow_of
from qmgrd.errors import SpoolError
from qmgrd.listener.flowgate import FlowFacts
from qmgrd.log import get_logger
from qmgrd.spool import QueueFile, Spool

if TYPE_CHECKING:
    from qmgrd.daemon.engine import Engine

__all__ = [
    "HEAD_CHUNK",
    "REFUSE_REPLY",
    "AdmissionSettings",
    "EngineFlowGate",
    "admission_settings",
    "read_flow_facts",
]

HEAD_CHUNK = 256  # envelope heads read per worker-thread job by a scan
REFUSE_REPLY = "452 4.3.2 Error: too much mail from this sender is waiting, try again later"
STATUS_TOP = 10  # flows named in status and metrics; the rest are summed as "other"

FlowFn = Callable[[FlowEnvelope], Flow]


@dataclass(frozen=True, slots=True)
class AdmissionSettings:
    """What fair admission decides with."""

    fairness: FairnessSettings
    limits: FlowLimits

    def flow_fn(self) -> FlowFn | None:
        """A message's admission flow from its envelope; None with fairness ``none``."""
        if self.fairness.default_key == "none":
            return None
        fairness = self.fairness
        return lambda envelope: flow_of(envelope, fairness)


def admission_settings(
    cfg: Config,
    warn: Callable[[str], None] = lambda _text: None,
    *,
    fairness: FairnessSettings | None = None,
) -> AdmissionSettings:
    """Fair admission's parameters (see the module doc); ConfigError for a bad weight table.

    ``fairness``: settings already built from the same ``cfg`` (the composition root builds them
    once for delivery and admission, so the weight tables are opened once).
    """
    rate = cfg.get_int("qmgr_flow_message_rate_limit")
    unit = max(1, cfg.get_time("qmgr_flow_rate_time_unit"))
    return AdmissionSettings(
        fairness=fairness if fairness is not None else fairness_settings(cfg, warn),
        limits=FlowLimits(
            active_limit=cfg.get_int("qmgr_flow_active_limit"),
            rate=rate / unit if rate > 0 else 0.0,
            burst=float(max(1, rate)),
            backlog_limit=cfg.get_int("qmgr_flow_backlog_limit"),
        ),
    )


def read_flow_facts(
    spool: Spool, source: str, queue_ids: Sequence[str]
) -> list[tuple[str, FlowFacts | None]]:
    """(queue id, the facts of its envelope head, None if unreadable) per id (worker thread)."""
    out: list[tuple[str, FlowFacts | None]] = []
    for queue_id in queue_ids:
        try:
            qf = QueueFile.open(spool.path(source, queue_id))
        except (SpoolError, OSError):
            out.append((queue_id, None))
            continue
        out.append((queue_id, FlowFacts(qf.sender, qf.client_addr, qf.sasl_username)))
    return out


def flow_or_none(fn: FlowFn | None, facts: FlowFacts | None) -> Flow:
    """The flow of ``facts`` under ``fn``; ``FLOW_NONE`` without either."""
    if fn is None or facts is None:
        return FLOW_NONE
    return fn(facts)


class EngineFlowGate:
    """The daemon's intake gate (``qmgrd.listener.flowgate.FlowGate``), in-process."""

    __slots__ = ("_engine", "_warned")

    def __init__(self, engine: Engine) -> None:
        """``engine``: whose admission backlog decides and who is told of commits."""
        self._engine = engine
        self._warned = False

    def refuse(self, facts: FlowFacts) -> str | None:
        """``REFUSE_REPLY`` when the flow of ``facts`` is over its backlog limit."""
        ctx = self._engine.ctx
        admission = ctx.table.admission
        if admission.limits.backlog_limit <= 0:
            return None
        try:
            flow = flow_or_none(ctx.admit_flow, facts)
        except Exception as exc:  # a table that fails must not stop intake
            if not self._warned:
                self._warned = True
                get_logger("smtpd").warning("cannot compute the flow at intake", error=repr(exc))
            return None
        return REFUSE_REPLY if admission.over_backlog(flow.key) else None

    def committed(self, queue_id: str, facts: FlowFacts) -> None:
        """Queue the committed file under its flow (``Engine.notify_incoming``)."""
        self._engine.notify_incoming(queue_id, facts)
