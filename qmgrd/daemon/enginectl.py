"""The engine's operator-facing side: control commands, status and reload (SIGHUP).

:class:`EngineControl` is a base of :class:`qmgrd.daemon.engine.Engine`; it
uses the engine's context, task supervisor and failure path (see the engine's
module doc).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from qmgrd.core.params import SchedulerParams, TransportParams
from qmgrd.core.resolve import Resolver
from qmgrd.daemon.admitting import STATUS_TOP
from qmgrd.daemon.context import EngineContext
from qmgrd.daemon.dispatch import close_agents
from qmgrd.daemon.operations import Operator
from qmgrd.daemon.settings import EngineSettings
from qmgrd.daemon.snapshot import EngineStatus, take_snapshot
from qmgrd.daemon.supervisor import TaskSupervisor
from qmgrd.delivery.agent import Agent
from qmgrd.errors import InvariantError
from qmgrd.ops.operation import Operation


class EngineControl:
    """hold/release/delete/requeue, flushes, the status snapshot and reload."""

    ctx: EngineContext
    tasks: TaskSupervisor
    operator: Operator
    log: Any
    _kick: asyncio.Event
    _started_at: float

    def _fail(self, exc: BaseException) -> None:
        raise NotImplementedError

    # ------------------------------------------------------------------ control

    async def operate(
        self, op: Operation, queue_ids: Sequence[str] | None, *, queue: str | None = None
    ) -> dict[str, str]:
        """hold / release / delete / requeue (``qmgrd.daemon.operations``).

        An ``InvariantError`` met on the way stops the daemon (and is raised to
        the control socket, which answers ``internal error``).
        """
        try:
            return await self.operator.operate(op, queue_ids, queue=queue)
        except InvariantError as exc:
            self._fail(exc)
            raise

    async def flush_destination(self, domain: str) -> int:
        """Forget that ``domain`` is dead and retry the deferred mail that has recipients there."""
        return await self.operator.flush_destination(domain)

    async def flush_message(self, queue_id: str) -> bool:
        """Retry one deferred message now; False if it is not in ``deferred/``."""
        return await self.operator.flush_message(queue_id)

    def snapshot(self) -> EngineStatus:
        """The typed status snapshot of what is in core."""
        return take_snapshot(
            self.ctx.scheduler,
            self.ctx.stats,
            self.ctx.table.waiting,
            self.ctx.clock.now() - self._started_at,
            admission=self.ctx.table.admission.backlogs(STATUS_TOP),
            destination_state=self.ctx.gate.status() if self.ctx.gate is not None else None,
        )

    def status(self) -> dict[str, Any]:
        """The snapshot's wire form (the control socket's ``status``; see ``snapshot``)."""
        return self.snapshot().to_json()

    # ------------------------------------------------------------------ reload

    def reload(
        self,
        *,
        settings: EngineSettings,
        scheduler_params: SchedulerParams,
        transport_params: Callable[[str], TransportParams],
        resolver: Resolver,
        agents: Mapping[str, Agent],
    ) -> None:
        """Apply a new configuration without dropping in-core mail (SIGHUP).

        Live destinations keep their state and take the new limits; new
        deliveries use the new agents; the old agents are closed once the
        deliveries that are using them finish.
        """
        ctx = self.ctx
        ctx.settings = settings
        ctx.resolver = resolver
        ctx.transport_params = transport_params
        ctx.scheduler.update_params(scheduler_params, transport_params)
        old_agents = list(ctx.agents.values())
        ctx.agents = dict(agents)
        in_flight = set(self.tasks.deliveries)
        self.tasks.spawn(self._close_agents_after(old_agents, in_flight))
        self.log.info("configuration reloaded")
        self._kick.set()

    async def _close_agents_after(
        self, agents: list[Agent], deliveries: set[asyncio.Task[None]]
    ) -> None:
        if deliveries:
            await asyncio.gather(*deliveries, return_exceptions=True)
        await close_agents(agents, self.log)
