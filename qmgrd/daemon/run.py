"""``qmgrd run``: the daemon in the foreground (what systemd starts).

``run_command`` loads the configuration, sets up logging and runs ``serve``
on uvloop when it is installed (plain asyncio otherwise) until SIGTERM or
SIGINT. ``serve`` is the daemon's composition: spool, listener and (next)
the queue-manager engine side by side on one loop; it returns when ``stop``
is set, after closing everything it started.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

from qmgrd.config import Config, load_config
from qmgrd.daemon.assemble import create_engine, reload_engine
from qmgrd.daemon.control import ControlServer, control_socket_path, start_control_server
from qmgrd.daemon.engine import Engine
from qmgrd.daemon.metrics import Metrics, spool_queue_counts, start_metrics_server
from qmgrd.daemon.sdnotify import Notifier
from qmgrd.errors import ConfigError
from qmgrd.listener import ListenerHandle, ListenerSettings, start_listener
from qmgrd.log import configure_logging, get_logger, reopen_logs
from qmgrd.spool import Spool

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

    Start order: spool directories, the engine (which recovers ``active/`` and
    scans ``incoming/`` before it delivers), the control socket and metrics
    endpoint, then the listener, whose commits wake the engine; systemd hears
    READY=1 only then. Stop order is the reverse: no new mail is accepted,
    then in-flight deliveries get ``shutdown_timeout`` to finish.
    """
    log = get_logger("master")
    notifier = notifier or Notifier(None)
    spool = Spool(cfg.get_path("queue_directory"))
    spool.ensure_dirs()
    metrics = Metrics(queue_counts_fn=lambda: spool_queue_counts(spool.root))
    engine = create_engine(cfg, spool=spool)
    engine.metrics = metrics
    metrics.status_fn = engine.snapshot
    engine_task = asyncio.get_running_loop().create_task(engine.run())
    async with contextlib.AsyncExitStack() as stack:
        stack.push_async_callback(_stop_engine, engine, engine_task)
        control = await start_control_server(control_socket_path(spool.root), engine, spool)
        stack.push_async_callback(_close_control, control)
        await _started(engine, engine_task)
        for host, port in cfg.get_hostports("metrics_listen"):
            try:
                server = await start_metrics_server(host, port, metrics)
            except OSError as exc:
                raise ConfigError(
                    f"metrics_listen: cannot listen on {host}:{port}: {exc.strerror or exc}"
                ) from exc
            stack.push_async_callback(server.aclose)
        listener = await start_listener(
            ListenerSettings.from_config(cfg), spool, on_commit=engine.notify_incoming
        )
        stack.push_async_callback(_close_listener, listener)
        log.info(
            f"daemon started -- version {VERSION}, configuration {cfg.config_dir}",
            queue_directory=str(spool.root),
        )
        notifier.ready(status="accepting mail")
        if ready is not None:
            ready(listener)
        if engine_ready is not None:
            engine_ready(engine)
        stop_wait = asyncio.ensure_future((stop or asyncio.Event()).wait())
        reloader = asyncio.ensure_future(
            _reload_on_hup(engine, listener, cfg, hup or asyncio.Event(), notifier)
        )
        try:
            done, _ = await asyncio.wait(
                {stop_wait, engine_task}, return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            reloader.cancel()
            stop_wait.cancel()
            log.info("stopping the daemon")
            notifier.stopping()
        if engine_task in done:
            engine_task.result()  # an engine crash is fatal: surface it


async def _started(engine: Engine, task: asyncio.Task[None]) -> None:
    """Wait for the engine's startup recovery (or its failure, which is then raised)."""
    started = asyncio.ensure_future(engine.wait_started())
    await asyncio.wait({started, task}, return_when=asyncio.FIRST_COMPLETED)
    if not started.done():
        started.cancel()
        task.result()


async def _stop_engine(engine: Engine, task: asyncio.Task[None]) -> None:
    engine.stop()
    if not task.done():
        await task


async def _close_control(control: ControlServer) -> None:
    control.close()
    await control.wait_closed()


async def _close_listener(listener: ListenerHandle) -> None:
    listener.close()
    await listener.wait_closed()


async def _reload_on_hup(
    engine: Engine,
    listener: ListenerHandle,
    cfg: Config,
    hup: asyncio.Event,
    notifier: Notifier,
) -> None:
    """On each SIGHUP: reopen the log file (rotation) and apply the new configuration.

    A bad configuration is refused with a log line and the old one keeps running.
    """
    while True:
        await hup.wait()
        hup.clear()
        notifier.reloading()
        reopen_logs()
        new_cfg = reload_engine(engine, cfg.config_dir)
        if new_cfg is not None:
            try:
                listener.update(ListenerSettings.from_config(new_cfg))
            except (ConfigError, ValueError) as exc:
                get_logger("master").error(f"listener settings not reloaded: {exc}")
        notifier.ready(status="accepting mail")


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
    await serve(cfg, stop=stop, hup=hup, notifier=Notifier.from_environment())


def run_command(config_dir: Path) -> int:
    """Entry point of ``qmgrd run``: returns 0 after a clean stop."""
    cfg = load_config(config_dir)
    log_format: Any = cfg.get_str("log_format")
    if log_format not in ("postfix", "json"):
        raise ConfigError(f"log_format: unknown format {log_format!r}")
    output = configure_logging(
        log_format,
        maillog_file=cfg.get_optional_path("maillog_file"),
        hostname=cfg.get_str("myhostname").split(".")[0],
    )
    try:
        log = get_logger("master")
        for warning in cfg.warnings:
            log.warning(warning)
        with asyncio.Runner(loop_factory=_loop_factory()) as runner:
            runner.run(_main(cfg))
    finally:
        output.close()
    return 0
