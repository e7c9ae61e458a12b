"""``qmgrd run``: the daemon in the foreground (what systemd starts).

``run_command`` loads the configuration, sets up logging and runs ``serve``
on uvloop when it is installed (plain asyncio otherwise) until SIGTERM or
SIGINT. ``serve`` is the daemon's composition: spool, listener and (next)
the queue-manager engine side by side on one loop; it returns when ``stop``
is set, after closing everything it started.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

from qmgrd.config import Config, load_config
from qmgrd.daemon.assemble import create_engine, reload_engine
from qmgrd.daemon.engine import Engine
from qmgrd.errors import ConfigError
from qmgrd.listener import ListenerHandle, ListenerSettings, start_listener
from qmgrd.log import configure_logging, get_logger
from qmgrd.spool import Spool

VERSION = "0.1.0"


async def serve(
    cfg: Config,
    *,
    stop: asyncio.Event | None = None,
    ready: Callable[[ListenerHandle], None] | None = None,
    engine_ready: Callable[[Engine], None] | None = None,
    hup: asyncio.Event | None = None,
) -> None:
    """Run the daemon until ``stop`` is set (never, if None); ``ready`` sees the listener.

    Start order: spool directories, the engine (which recovers ``active/`` and
    scans ``incoming/`` before it delivers), then the listener, whose commits
    wake the engine. Stop order is the reverse: no new mail is accepted, then
    in-flight deliveries get ``shutdown_timeout`` to finish.
    """
    log = get_logger("master")
    spool = Spool(cfg.get_path("queue_directory"))
    spool.ensure_dirs()
    engine = create_engine(cfg, spool=spool)
    engine_task = asyncio.get_running_loop().create_task(engine.run())
    try:
        listener = await start_listener(
            ListenerSettings.from_config(cfg), spool, on_commit=engine.notify_incoming
        )
    except BaseException:
        engine.stop()
        await engine_task
        raise
    log.info(
        f"daemon started -- version {VERSION}, configuration {cfg.config_dir}",
        queue_directory=str(spool.root),
    )
    try:
        if ready is not None:
            ready(listener)
        if engine_ready is not None:
            engine_ready(engine)
        stop_wait = asyncio.ensure_future((stop or asyncio.Event()).wait())
        reloader = asyncio.ensure_future(_reload_on_hup(engine, cfg, hup or asyncio.Event()))
        done, _ = await asyncio.wait({stop_wait, engine_task}, return_when=asyncio.FIRST_COMPLETED)
        reloader.cancel()
        if engine_task in done:
            stop_wait.cancel()
            engine_task.result()  # an engine crash is fatal: surface it
    finally:
        log.info("stopping the daemon")
        listener.close()
        await listener.wait_closed()
        engine.stop()
        if not engine_task.done():
            await engine_task


async def _reload_on_hup(engine: Engine, cfg: Config, hup: asyncio.Event) -> None:
    """Apply a new configuration each time ``hup`` is set (SIGHUP); a bad one is refused."""
    while True:
        await hup.wait()
        hup.clear()
        reload_engine(engine, cfg.config_dir)


def _loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux
        return None
    factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    return factory


async def _main(cfg: Config) -> None:
    stop = asyncio.Event()
    hup = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    loop.add_signal_handler(signal.SIGHUP, hup.set)
    await serve(cfg, stop=stop, hup=hup)


def run_command(config_dir: Path) -> int:
    """Entry point of ``qmgrd run``: returns 0 after a clean stop."""
    cfg = load_config(config_dir)
    log_format: Any = cfg.get_str("log_format")
    if log_format not in ("postfix", "json"):
        raise ConfigError(f"log_format: unknown format {log_format!r}")
    configure_logging(log_format)
    log = get_logger("master")
    for warning in cfg.warnings:
        log.warning(warning)
    with asyncio.Runner(loop_factory=_loop_factory()) as runner:
        runner.run(_main(cfg))
    return 0
