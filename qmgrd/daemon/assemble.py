"""Build a running engine's parts from a `Config`: scheduler, resolver, agents.

Kept apart from the engine so that the engine takes plain collaborators (tests
hand it fakes) and a reload can rebuild exactly these pieces.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from qmgrd.config import Config, check_reloadable, load_config
from qmgrd.core.resolve import Resolver
from qmgrd.core.scheduler import Scheduler
from qmgrd.daemon.clock import Clock, SystemClock
from qmgrd.daemon.engine import Engine
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
        agents[name] = create_agent(command, SmtpSettings.from_transport(cfg.transport(name)))
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
    return Engine(
        settings=settings,
        spool=spool or Spool(settings.queue_directory),
        scheduler=Scheduler(scheduler_params(cfg), params),
        resolver=Resolver(resolver_settings(cfg, _read_text)),
        transport_params=params,
        agents=agents if agents is not None else create_agents(cfg),
        clock=clock or SystemClock(),
        io=IoBatcher(),
    )


def reload_engine(engine: Engine, config_dir: Path, running: Config | None = None) -> Config | None:
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
        agents = create_agents(cfg)
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
    return cfg
