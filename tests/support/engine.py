"""An engine for engine tests: the real scheduler, spool and resolver, fake agents and clock.

``create_test_engine(root, agent, main)`` writes a configuration under ``root``
(``write_config``; ``main`` is appended to main.cf), builds the engine with
``qmgrd.daemon.assemble.create_engine`` on a ``FakeClock`` and a spool without
fsync, and hands ``agent`` both the ``smtp`` and the ``relay`` transports.
``submit`` commits a message to ``incoming/`` as the listener would (no
wake-up: the engine finds it at its start-up scan). ``run_until_idle`` starts
the engine and waits (bounded) until it is idle; ``stop_engine`` stops it.
``fail_early_removal(monkeypatch)``: the last delivery's file job cannot remove the
finished file (``qmgrd.daemon.outcomes``), so it marks the recipients done and the
finisher runs its own steps.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from qmgrd.config import load_config
from qmgrd.daemon import outcomes
from qmgrd.daemon.assemble import create_engine
from qmgrd.daemon.engine import Engine
from qmgrd.delivery.agent import Agent
from qmgrd.spool import Envelope, RecipientSpec, Spool
from tests.support.clock import FakeClock
from tests.support.config import write_config
from tests.support.waits import TIMEOUT


def create_test_engine(
    root: Path, agent: Agent, main: str = ""
) -> tuple[Engine, Spool, FakeClock]:
    """An engine (not running) whose smtp and relay transports deliver through ``agent``."""
    cfg = load_config(write_config(root, main), hostname="mx.test")
    clock = FakeClock()
    spool = Spool(cfg.get_path("queue_directory"), fsync=False)
    spool.ensure_dirs()
    engine = create_engine(cfg, spool=spool, clock=clock, agents={"smtp": agent, "relay": agent})
    return engine, spool, clock


def submit(
    spool: Spool, clock: FakeClock, sender: str, rcpts: list[str], body: bytes = b""
) -> str:
    """Commit one message to ``incoming/`` (arrival time: the clock's now); its queue id."""
    env = Envelope(
        sender=sender,
        recipients=tuple(RecipientSpec(r) for r in rcpts),
        arrival_time=clock.now(),
    )
    content = b"Subject: test\r\nMessage-ID: <m@test>\r\n\r\n" + (body or b"hello\r\n")
    return spool.commit(env, content)


async def run_until_idle(engine: Engine, timeout: float = TIMEOUT) -> asyncio.Task[None]:
    """Start ``engine.run()`` and wait until the engine is idle; the running task."""
    task = asyncio.create_task(engine.run())
    await asyncio.wait_for(engine.wait_idle(), timeout)
    return task


async def stop_engine(engine: Engine, task: asyncio.Task[None], timeout: float = TIMEOUT) -> None:
    """Stop the engine and wait (bounded) for its task to end."""
    engine.stop()
    await asyncio.wait_for(task, timeout)


def fail_early_removal(monkeypatch: pytest.MonkeyPatch) -> None:
    """The last delivery's early removal fails with EIO (see the module doc)."""

    def refuse(*_args: object) -> bool:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(outcomes, "retire", refuse)
