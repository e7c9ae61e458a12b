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
) -> None:
    """Run the daemon until ``stop`` is set (never, if None); ``ready`` sees the listener."""
    log = get_logger("master")
    spool = Spool(cfg.get_path("queue_directory"))
    spool.ensure_dirs()
    stale = spool.remove_temp_files()
    if stale:
        log.info("removed unfinished queue files", count=stale)
    # The queue manager engine plugs in here: recover active/, then scan incoming/
    # and deferred/; its wake-up becomes the listener's on_commit.
    listener = await start_listener(
        ListenerSettings.from_config(cfg), spool, on_commit=lambda _queue_id: None
    )
    log.info(
        f"daemon started -- version {VERSION}, configuration {cfg.config_dir}",
        queue_directory=str(spool.root),
    )
    try:
        if ready is not None:
            ready(listener)
        await (stop or asyncio.Event()).wait()
    finally:
        log.info("stopping the daemon")
        listener.close()
        await listener.wait_closed()


def _loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux
        return None
    factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    return factory


async def _main(cfg: Config) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    await serve(cfg, stop=stop)


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
