"""The composition root (``assemble.Daemon``): start order, a failed start, reload, stop."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

import pytest

from qmgrd.config import load_config
from qmgrd.daemon.assemble import Daemon
from qmgrd.daemon.control import control_socket_path
from qmgrd.errors import ConfigError
from qmgrd.ops.client import call
from tests.support.clock import FakeClock
from tests.support.config import write_config
from tests.support.logs import watch_logs

TIMEOUT = 20.0


class BrokenClock(FakeClock):
    """A fake clock that raises once ``broken`` is set: a bug inside the engine's loop."""

    __slots__ = ("broken",)

    def __init__(self) -> None:
        super().__init__()
        self.broken = False

    def now(self) -> float:
        if self.broken:
            raise RuntimeError("clock bug")
        return super().now()


async def test_start_serves_control_and_smtp_and_stop_closes_both(tmp_path: Path) -> None:
    """After start the control socket answers and the listener accepts; stop removes both."""
    cfg = load_config(write_config(tmp_path), hostname="mx.test")
    daemon = Daemon(cfg, clock=FakeClock(), fsync=False)
    await asyncio.wait_for(daemon.start(), TIMEOUT)
    sock = control_socket_path(daemon.spool.root)
    try:
        reply = await asyncio.wait_for(asyncio.to_thread(call, sock, {"op": "ping"}), TIMEOUT)
        assert reply["ok"] is True
        assert daemon.listener is not None
        host, port = daemon.listener.addresses[0]
        reader, writer = await asyncio.open_connection(host, port)
        assert (await asyncio.wait_for(reader.readline(), TIMEOUT)).startswith(b"220 ")
        writer.close()
    finally:
        await asyncio.wait_for(daemon.stop(), TIMEOUT)
    assert not sock.exists()
    assert daemon.listener is None
    assert daemon.task.done() and daemon.task.exception() is None


async def test_a_failed_start_closes_what_it_started(tmp_path: Path) -> None:
    """A metrics port already in use is a ConfigError naming metrics_listen; the control
    socket and the engine started before it are closed again, and no listener is left."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        cfg = load_config(
            write_config(tmp_path, f"metrics_listen = 127.0.0.1:{port}"), hostname="mx.test"
        )
        daemon = Daemon(cfg, clock=FakeClock(), fsync=False)
        with pytest.raises(ConfigError, match="metrics_listen"):
            await asyncio.wait_for(daemon.start(), TIMEOUT)
    assert not control_socket_path(daemon.spool.root).exists()
    assert daemon.listener is None
    assert daemon.task.done()


async def test_reload_applies_a_good_configuration_and_refuses_a_bad_one(tmp_path: Path) -> None:
    """reload() swaps in a changed main.cf; a broken one is refused, logged, the old one kept."""
    conf = write_config(tmp_path)
    daemon = Daemon(load_config(conf, hostname="mx.test"), clock=FakeClock(), fsync=False)
    await asyncio.wait_for(daemon.start(listen=False), TIMEOUT)
    try:
        main_cf = conf / "main.cf"
        main_cf.write_text(main_cf.read_text() + "maximal_queue_lifetime = 2d\n")
        assert daemon.reload() is True
        assert daemon.cfg.get_time("maximal_queue_lifetime") == 2 * 86400
        main_cf.write_text(main_cf.read_text() + "soft_bounce = maybe\n")
        with watch_logs() as logs:
            assert daemon.reload() is False
        assert logs.events("reload refused")
        assert daemon.cfg.get_time("maximal_queue_lifetime") == 2 * 86400
    finally:
        await asyncio.wait_for(daemon.stop(), TIMEOUT)


async def test_wait_returns_on_stop_and_raises_an_engine_crash(tmp_path: Path) -> None:
    """wait(stop) returns once stop is set; an engine that dies on its own raises there."""
    cfg = load_config(write_config(tmp_path), hostname="mx.test")
    daemon = Daemon(cfg, clock=FakeClock(), fsync=False)
    await asyncio.wait_for(daemon.start(listen=False), TIMEOUT)
    stop = asyncio.Event()
    stop.set()
    await asyncio.wait_for(daemon.wait(stop), TIMEOUT)
    await asyncio.wait_for(daemon.stop(), TIMEOUT)

    clock = BrokenClock()
    crashing = Daemon(cfg, clock=clock, fsync=False)
    await asyncio.wait_for(crashing.start(listen=False), TIMEOUT)
    clock.broken = True
    crashing.engine.wakeup()
    try:
        with pytest.raises(RuntimeError, match="clock bug"):
            await asyncio.wait_for(crashing.wait(asyncio.Event()), TIMEOUT)
    finally:
        clock.broken = False
        await asyncio.wait_for(crashing.stop(), TIMEOUT)
