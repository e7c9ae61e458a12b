"""``qmgrd run``: the daemon in the foreground (what systemd starts).

``run_command`` loads the configuration, sets up logging and runs ``serve``
on uvloop when it is installed (plain asyncio otherwise) until SIGTERM or
SIGINT. ``serve`` runs the daemon that ``assemble.Daemon`` composes (spool,
engine, control socket, metrics, listener) and adds what belongs to the
process: the start and stop log lines, sd_notify and SIGHUP reloads; it
returns when ``stop`` is set, after closing everything it started. Once the
daemon has started, before the ``daemon started`` line and READY=1 (its
work belongs to start-up, not to the first messages), ``qmgrd run`` fills a
fresh spool's recycle pool (``qmgrd.spool.poolslot.prefill``) and settles the
garbage collector (``qmgrd.daemon.process.settle_gc``: a full collection,
0.12 s of wall time measured in the queue manager at load average 15).
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Callable
from pathlib import Path

from qmgrd.config import Config, load_config
from qmgrd.daemon.assemble import Daemon
from qmgrd.daemon.dpool import delivery_worker_count
from qmgrd.daemon.engine import Engine
from qmgrd.daemon.process import loop_factory, open_log_output, settle_gc
from qmgrd.daemon.sdnotify import Notifier
from qmgrd.daemon.workers import worker_count
from qmgrd.listener import ListenerHandle
from qmgrd.log import get_logger, reopen_logs
from qmgrd.spool.lock import lock_spool
from qmgrd.spool.poolslot import PREFILL, prefill
from qmgrd.spool.recycle import RECYCLE_DIR

VERSION = "0.1.0"


async def serve(
    cfg: Config,
    *,
    stop: asyncio.Event | None = None,
    ready: Callable[[ListenerHandle], None] | None = None,
    engine_ready: Callable[[Engine], None] | None = None,
    hup: asyncio.Event | None = None,
    notifier: Notifier | None = None,
) -> None:
    """Run the daemon until ``stop`` is set (never, if None); ``ready`` sees the listener.

    The parts and their start and stop order are ``assemble.Daemon``'s; systemd
    hears READY=1 once it accepts mail. On stop no new mail is accepted, then
    in-flight deliveries get ``shutdown_timeout`` to finish.
    """
    log = get_logger("master")
    notifier = notifier or Notifier(None)
    daemon = Daemon(cfg, workers=worker_count(cfg), delivery_workers=delivery_worker_count(cfg))
    await daemon.start()
    try:
        if engine_ready is not None:  # before "daemon started": its work is start-up's
            engine_ready(daemon.engine)
        log.info(
            f"daemon started -- version {VERSION}, configuration {cfg.config_dir}",
            queue_directory=str(daemon.spool.root),
        )
        notifier.ready(status="accepting mail")
        if ready is not None and daemon.listener is not None:
            ready(daemon.listener)
        reloader = asyncio.ensure_future(_reload_on_hup(daemon, hup or asyncio.Event(), notifier))
        try:
            await daemon.wait(stop or asyncio.Event())
        finally:
            reloader.cancel()
            log.info("stopping the daemon")
            notifier.stopping()
    finally:
        await daemon.stop()


async def _reload_on_hup(daemon: Daemon, hup: asyncio.Event, notifier: Notifier) -> None:
    """On each SIGHUP: reopen the log file (rotation) and apply the new configuration.

    A bad configuration is refused with a log line and the old one keeps running.
    """
    while True:
        await hup.wait()
        hup.clear()
        notifier.reloading()
        reopen_logs()
        daemon.reload()
        await daemon.wait_reloaded()  # listener workers too
        notifier.ready(status="accepting mail")


async def _main(cfg: Config) -> None:
    stop = asyncio.Event()
    hup = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    loop.add_signal_handler(signal.SIGHUP, hup.set)
    await serve(
        cfg,
        stop=stop,
        hup=hup,
        notifier=Notifier.from_environment(),
        engine_ready=_started,  # this process only: not tests' serve()
    )


def _started(engine: Engine) -> None:
    """``qmgrd run`` has started, before it says so: fill a fresh recycle pool, settle the
    collector (start-up work, done before "daemon started" and READY=1, not under load)."""
    prefill(f"{engine.ctx.spool.root}/{RECYCLE_DIR}", PREFILL)
    settle_gc()


def run_command(config_dir: Path) -> int:
    """Entry point of ``qmgrd run``: returns 0 after a clean stop."""
    cfg = load_config(config_dir)
    output = open_log_output(cfg)
    try:
        log = get_logger("master")
        for warning in cfg.warnings:
            log.warning(warning)
        # The spool lock comes before any spool change; a second daemon stops here.
        with lock_spool(cfg.get_path("queue_directory")), asyncio.Runner(
            loop_factory=loop_factory()
        ) as runner:
            runner.run(_main(cfg))
    finally:
        output.close()
    return 0
