"""Wiring: build an engine and its agents from a ``Config``, and apply a reload to them.

``create_agents(cfg)`` makes one agent per master.cf delivery service with
that service's settings (``qmgrd.delivery.factory``), the same in the queue
manager and in a delivery worker process. ``create_engine`` wires an engine
from its plain collaborators (scheduler, resolver, agents), kept apart from
the engine so that tests can hand it fakes and ``reload_engine`` can rebuild
exactly these pieces on SIGHUP (``make_agents``: how the agents are made,
``qmgrd.daemon.dpool.remote_agents`` with delivery workers). ``assemble``
composes the whole daemon from them and exports them.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from qmgrd.config import Config, check_reloadable, load_config
from qmgrd.config.maps import locate_error
from qmgrd.core.resolve import Resolver
from qmgrd.core.scheduler import Scheduler
from qmgrd.daemon.admitting import admission_settings
from qmgrd.daemon.clock import Clock, SystemClock
from qmgrd.daemon.destgate import GateSettings, create_gate
from qmgrd.daemon.engine import Engine
from qmgrd.daemon.flows import fairness_settings
from qmgrd.daemon.iobatch import IoBatcher
from qmgrd.daemon.settings import (
    delivery_services,
    engine_settings,
    resolver_settings,
    scheduler_params,
    transport_params_fn,
)
from qmgrd.delivery.agent import Agent
from qmgrd.delivery.factory import create_agent
from qmgrd.delivery.settings import SmtpSettings
from qmgrd.errors import ConfigError
from qmgrd.log import get_logger
from qmgrd.spool import Spool


def _read_text(path: Path) -> str:
    return path.read_text(encoding="utf-8")


def create_agents(cfg: Config) -> dict[str, Agent]:
    """One agent per master.cf delivery service, with that service's settings."""
    agents: dict[str, Agent] = {}
    for name, command in delivery_services(cfg).items():
        view = cfg.transport(name)
        try:
            agents[name] = create_agent(command, SmtpSettings.from_transport(view))
        except ConfigError as exc:  # settings name the parameter; say where it is set
            raise ConfigError(locate_error(cfg, view, str(exc))) from None
    return agents


def create_engine(
    cfg: Config,
    *,
    spool: Spool | None = None,
    clock: Clock | None = None,
    agents: dict[str, Agent] | None = None,
    warn: Callable[[str], None] | None = None,
) -> Engine:
    """An engine wired from the configuration (agents may be replaced by tests)."""
    log = get_logger("qmgr")

    def _warn(text: str) -> None:
        log.warning(text)

    warn = warn or _warn
    settings = engine_settings(cfg)
    params = transport_params_fn(cfg, warn)
    fairness = fairness_settings(cfg, warn)
    admission = admission_settings(cfg, fairness=fairness)
    engine = Engine(
        settings=settings,
        spool=spool or Spool(settings.queue_directory),
        scheduler=Scheduler(scheduler_params(cfg), params),
        resolver=Resolver(resolver_settings(cfg, _read_text)),
        transport_params=params,
        agents=agents if agents is not None else create_agents(cfg),
        clock=clock or SystemClock(),
        io=IoBatcher(),
    )
    engine.ctx.fairness = fairness
    engine.configure_admission(admission)
    # cluster: the destination gate (qmgrd.daemon.destgate); Daemon closes it after the engine
    engine.ctx.gate = create_gate(cfg, engine.ctx, tuple(delivery_services(cfg)))
    return engine


def reload_engine(
    engine: Engine,
    config_dir: Path,
    running: Config | None = None,
    make_agents: Callable[[Config], dict[str, Agent]] = create_agents,
) -> Config | None:
    """SIGHUP: re-read main.cf and master.cf and apply them; None (old config kept) on error.

    Everything is built before anything is swapped in, so a bad file changes
    nothing: the error is logged with its file, line and parameter.
    """
    log = get_logger("master")
    try:
        cfg = load_config(config_dir)
        if running is not None:
            check_reloadable(running, cfg)  # start-only parameters (queue_directory, ...)
        settings = engine_settings(cfg)
        params = transport_params_fn(cfg, lambda text: log.warning(text))
        resolver = Resolver(resolver_settings(cfg, _read_text))
        sched = scheduler_params(cfg)
        fairness = fairness_settings(cfg, lambda text: log.warning(text))
        agents = make_agents(cfg)
        admission = admission_settings(cfg, fairness=fairness)
        gate = GateSettings.from_config(cfg, tuple(delivery_services(cfg)))  # cluster
    except (ConfigError, ValueError) as exc:
        log.error(f"reload refused, keeping the running configuration: {exc}")
        return None
    for warning in cfg.warnings:
        log.warning(warning)
    engine.reload(
        settings=settings,
        scheduler_params=sched,
        transport_params=params,
        resolver=resolver,
        agents=agents,
    )
    engine.ctx.fairness = fairness  # messages loaded from now on get flows by the new settings
    engine.configure_admission(admission)
    if engine.ctx.gate is not None:
        engine.ctx.gate.update(gate)  # cluster: reloaded rate limits and caps
    return cfg
