"""The control socket server against a fake engine: protocol, errors, limits, lifecycle."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import stat
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from qmgrd.daemon.control import (
    ControlServer,
    Operation,
    control_socket_path,
    start_control_server,
)
from qmgrd.daemon.snapshot import EngineStatus
from qmgrd.errors import InvariantError, SpoolError
from qmgrd.ops.client import ControlError, DaemonNotRunning, call
from qmgrd.spool import Envelope, RecipientSpec, Spool
from tests.support.waits import Changes

TIMEOUT = 10.0


class FakeEngine:
    """Records every call; answers like the engine contract says."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.fail_with: BaseException | None = None
        self.block: asyncio.Event | None = None
        self.changes = Changes()  # notified at each call

    def flush(self) -> None:
        self.calls.append(("flush", None))

    async def flush_destination(self, domain: str) -> int:
        self.calls.append(("flush_destination", domain))
        return 3

    async def flush_message(self, queue_id: str) -> bool:
        self.calls.append(("flush_message", queue_id))
        return queue_id.startswith("A")

    def request_incoming_scan(self) -> None:
        self.calls.append(("scan", None))

    def snapshot(self) -> EngineStatus:
        if self.fail_with is not None:
            raise self.fail_with
        return EngineStatus.from_json({"uptime": 1.5, "messages_in_core": 2, "transports": []})

    async def operate(
        self, op: Operation, queue_ids: Sequence[str] | None, *, queue: str | None = None
    ) -> dict[str, str]:
        self.calls.append((op, None if queue_ids is None else list(queue_ids)))
        self.changes.notify()
        if self.block is not None:
            await self.block.wait()
        ids = ["AAAAAAAAAAAAAAA"] if queue_ids is None else queue_ids
        return {q: "ok" for q in ids}


QID = "AAAAAAAAAAAAAAA"


@pytest.fixture
async def server(spool: Spool) -> AsyncIterator[tuple[ControlServer, FakeEngine]]:
    engine = FakeEngine()
    srv = await start_control_server(control_socket_path(spool.root), engine, spool)
    try:
        yield srv, engine
    finally:
        srv.close()
        await asyncio.wait_for(srv.wait_closed(), TIMEOUT)


class Client:
    """A raw line client on the test's loop."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    @classmethod
    async def connect(cls, path: Path) -> Client:
        reader, writer = await asyncio.open_unix_connection(str(path))
        return cls(reader, writer)

    async def send_raw(self, data: bytes) -> dict[str, Any]:
        self.writer.write(data)
        await self.writer.drain()
        line = await asyncio.wait_for(self.reader.readline(), TIMEOUT)
        assert line.endswith(b"\n"), line
        reply = json.loads(line)
        assert isinstance(reply, dict)
        return reply

    async def send(self, obj: Any) -> dict[str, Any]:
        return await self.send_raw(json.dumps(obj).encode() + b"\n")

    async def close(self) -> None:
        self.writer.close()
        await self.writer.wait_closed()


async def test_socket_mode_and_location(server: tuple[ControlServer, FakeEngine]) -> None:
    """The socket is <queue_directory>/public/qmgrd.sock with mode 0660."""
    srv, _ = server
    assert srv.path.name == "qmgrd.sock" and srv.path.parent.name == "public"
    mode = os.lstat(srv.path).st_mode
    assert stat.S_ISSOCK(mode)
    assert stat.S_IMODE(mode) == 0o660


async def test_flush_variants_reach_the_engine(server: tuple[ControlServer, FakeEngine]) -> None:
    """flush, flush -s and flush -i call the matching engine method and report its answer."""
    srv, engine = server
    client = await Client.connect(srv.path)
    assert await client.send({"op": "flush"}) == {"ok": True}
    assert await client.send({"op": "flush", "destination": "example.com"}) == {
        "ok": True,
        "messages": 3,
    }
    assert await client.send({"op": "flush", "queue_id": QID}) == {"ok": True, "found": True}
    assert await client.send({"op": "flush", "queue_id": "BBBBBBBBBBBBBBB"}) == {
        "ok": True,
        "found": False,
    }
    assert await client.send({"op": "scan"}) == {"ok": True}
    await client.close()
    assert engine.calls == [
        ("flush", None),
        ("flush_destination", "example.com"),
        ("flush_message", QID),
        ("flush_message", "BBBBBBBBBBBBBBB"),
        ("scan", None),
    ]


async def test_status_adds_file_counts(
    server: tuple[ControlServer, FakeEngine], spool: Spool
) -> None:
    """status merges the engine snapshot with per-queue file counts and the daemon pid."""
    srv, _ = server
    env = Envelope("s@x.test", (RecipientSpec("r@y.test"),), 1.0)
    spool.commit(env, b"x")
    held = spool.commit(env, b"y")
    spool.move(held, "incoming", "hold")
    client = await Client.connect(srv.path)
    reply = await client.send({"op": "status"})
    await client.close()
    assert reply == {
        "ok": True,
        "pid": os.getpid(),
        "queue_files": {"incoming": 1, "active": 0, "deferred": 0, "hold": 1, "corrupt": 0},
        "uptime": 1.5,
        "messages_in_core": 2,
        "recipients_in_core": 0,
        "messages_waiting": 0,
        "stats": {},
        "transports": [],
        "admission": [],
    }


async def test_operations_pass_ids_or_all(server: tuple[ControlServer, FakeEngine]) -> None:
    """hold/release/delete/requeue pass a de-duplicated id list, or None for ALL."""
    srv, engine = server
    client = await Client.connect(srv.path)
    reply = await client.send({"op": "delete", "ids": [QID, QID]})
    assert reply == {"ok": True, "results": {QID: "ok"}}
    reply = await client.send({"op": "hold", "ids": "ALL"})
    assert reply == {"ok": True, "results": {QID: "ok"}}
    await client.send({"op": "release", "ids": [QID]})
    await client.send({"op": "requeue", "ids": [QID]})
    await client.close()
    assert engine.calls == [
        ("delete", [QID]),
        ("hold", None),
        ("release", [QID]),
        ("requeue", [QID]),
    ]


@pytest.mark.parametrize(
    ("raw", "error"),
    [
        (b"this is not json\n", "request is not valid JSON"),
        (b"\xff\xfe\x00garbage\n", "request is not valid JSON"),
        (b"[1, 2]\n", "request must be a JSON object"),
        (b'{"op": "reboot"}\n', "unknown op 'reboot'"),
        (b'{"no": "op"}\n', "unknown op None"),
        (b'{"op": "flush", "destination": "a", "queue_id": "AAAAAAAAAAAAAAA"}\n', "not both"),
        (b'{"op": "flush", "queue_id": "../../etc/passwd"}\n', "not a queue id"),
        (b'{"op": "flush", "destination": ""}\n', "non-empty string"),
        (b'{"op": "delete", "ids": ["../x"]}\n', "not a queue id: '../x'"),
        (b'{"op": "delete", "ids": []}\n', "ids is empty"),
        (b'{"op": "delete", "ids": "SOME"}\n', 'list of queue ids or "ALL"'),
        (b'{"op": "delete"}\n', 'list of queue ids or "ALL"'),
        (b'{"op": "scan", "extra": 1}\n', "unexpected field(s) for scan: extra"),
    ],
)
async def test_garbage_gets_an_error_and_the_connection_stays_usable(
    server: tuple[ControlServer, FakeEngine], raw: bytes, error: str
) -> None:
    """A malformed request is answered with ok=false and the same connection still works."""
    srv, engine = server
    client = await Client.connect(srv.path)
    reply = await client.send_raw(raw)
    assert reply["ok"] is False
    assert error in reply["error"]
    assert await client.send({"op": "ping"}) == {"ok": True, "pid": os.getpid()}
    await client.close()
    assert engine.calls == []


async def test_overlong_line_is_refused_and_closed(
    server: tuple[ControlServer, FakeEngine],
) -> None:
    """A request longer than 64 KiB gets an error and the connection is closed; others go on."""
    srv, _ = server
    client = await Client.connect(srv.path)
    reply = await client.send_raw(b'{"op": "' + b"x" * (70 * 1024) + b'"}\n')
    assert reply == {"ok": False, "error": "request longer than 65536 bytes"}
    assert await asyncio.wait_for(client.reader.read(), TIMEOUT) == b""
    await client.close()
    other = await Client.connect(srv.path)
    assert (await other.send({"op": "ping"}))["ok"] is True
    await other.close()


@pytest.mark.parametrize(
    ("exc", "text"),
    [
        (RuntimeError("boom"), "internal error: RuntimeError('boom')"),
        (InvariantError("broken"), "internal error: broken"),
        (SpoolError("disk on fire"), "disk on fire"),
    ],
)
async def test_engine_exception_is_an_error_reply(
    server: tuple[ControlServer, FakeEngine], exc: BaseException, text: str
) -> None:
    """An exception from the engine becomes an error reply; the server keeps serving."""
    srv, engine = server
    engine.fail_with = exc
    client = await Client.connect(srv.path)
    assert await client.send({"op": "status"}) == {"ok": False, "error": text}
    engine.fail_with = None
    assert (await client.send({"op": "status"}))["ok"] is True
    await client.close()


async def test_many_clients_at_once(server: tuple[ControlServer, FakeEngine]) -> None:
    """Thirty concurrent clients each get their own reply."""
    srv, _ = server

    async def one(i: int) -> dict[str, Any]:
        client = await Client.connect(srv.path)
        try:
            return await client.send({"op": "flush", "destination": f"d{i}.test"})
        finally:
            await client.close()

    replies = await asyncio.wait_for(asyncio.gather(*(one(i) for i in range(30))), TIMEOUT)
    assert replies == [{"ok": True, "messages": 3}] * 30


async def test_client_limit(spool: Spool) -> None:
    """Beyond max_clients, a connection is told to try again and closed."""
    engine = FakeEngine()
    srv = await start_control_server(
        control_socket_path(spool.root), engine, spool, max_clients=2
    )
    try:
        first = await Client.connect(srv.path)
        second = await Client.connect(srv.path)
        assert (await first.send({"op": "ping"}))["ok"] is True
        assert (await second.send({"op": "ping"}))["ok"] is True
        third = await Client.connect(srv.path)
        line = await asyncio.wait_for(third.reader.readline(), TIMEOUT)
        assert json.loads(line) == {"ok": False, "error": "too many control clients; try again"}
        assert await asyncio.wait_for(third.reader.read(), TIMEOUT) == b""
        for c in (first, second, third):
            await c.close()
    finally:
        srv.close()
        await asyncio.wait_for(srv.wait_closed(), TIMEOUT)


async def test_silent_client_is_hung_up_on(spool: Spool) -> None:
    """A client that sends nothing within client_timeout is disconnected."""
    srv = await start_control_server(
        control_socket_path(spool.root), FakeEngine(), spool, client_timeout=0.2
    )
    try:
        client = await Client.connect(srv.path)
        assert await asyncio.wait_for(client.reader.read(), TIMEOUT) == b""
        await client.close()
    finally:
        srv.close()
        await asyncio.wait_for(srv.wait_closed(), TIMEOUT)


async def test_close_hangs_up_idle_clients_and_removes_the_socket(spool: Spool) -> None:
    """close() + wait_closed() end promptly with a client connected; the socket file goes."""
    srv = await start_control_server(control_socket_path(spool.root), FakeEngine(), spool)
    client = await Client.connect(srv.path)
    assert (await client.send({"op": "ping"}))["ok"] is True
    srv.close()
    await asyncio.wait_for(srv.wait_closed(), TIMEOUT)
    assert not srv.path.exists()
    assert await asyncio.wait_for(client.reader.read(), TIMEOUT) == b""
    await client.close()


async def test_close_waits_for_a_running_operation(spool: Spool) -> None:
    """An operation in progress at close() still completes before wait_closed() returns."""
    engine = FakeEngine()
    engine.block = asyncio.Event()
    srv = await start_control_server(control_socket_path(spool.root), engine, spool)
    client = await Client.connect(srv.path)
    client.writer.write(b'{"op": "hold", "ids": ["AAAAAAAAAAAAAAA"]}\n')
    await client.writer.drain()
    await engine.changes.wait_for(lambda: bool(engine.calls), "the request to reach the engine")
    assert engine.calls == [("hold", [QID])]
    srv.close()
    closing = asyncio.ensure_future(srv.wait_closed())
    await asyncio.sleep(0)  # one loop turn: wait_closed starts, and must not finish
    assert not closing.done()
    engine.block.set()
    await asyncio.wait_for(closing, TIMEOUT)
    await client.close()


async def test_stale_socket_is_replaced(spool: Spool) -> None:
    """A socket file nobody listens on (a dead daemon's) is removed at start."""
    path = control_socket_path(spool.root)
    with socket.socket(socket.AF_UNIX) as dead:
        dead.bind(str(path))
    assert stat.S_ISSOCK(os.lstat(path).st_mode)
    srv = await start_control_server(path, FakeEngine(), spool)
    try:
        client = await Client.connect(path)
        assert (await client.send({"op": "ping"}))["ok"] is True
        await client.close()
    finally:
        srv.close()
        await asyncio.wait_for(srv.wait_closed(), TIMEOUT)


async def test_live_socket_is_not_stolen(server: tuple[ControlServer, FakeEngine]) -> None:
    """A second server on a socket that still answers fails with a clear SpoolError."""
    srv, engine = server
    with pytest.raises(SpoolError, match="another qmgrd answers on"):
        await start_control_server(srv.path, engine, srv.spool)
    assert stat.S_ISSOCK(os.lstat(srv.path).st_mode)


async def test_regular_file_in_the_way(spool: Spool) -> None:
    """A regular file at the socket path is not deleted: SpoolError names it."""
    path = control_socket_path(spool.root)
    path.write_text("precious")
    with pytest.raises(SpoolError, match="exists and is not a socket"):
        await start_control_server(path, FakeEngine(), spool)
    assert path.read_text() == "precious"


async def test_long_socket_path(tmp_path: Path) -> None:
    """A socket path over the 107-byte sun_path limit works for server and client."""
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    spool = Spool(deep / "spool", fsync=False)
    spool.ensure_dirs()
    path = control_socket_path(spool.root)
    assert len(str(path)) > 107
    srv = await start_control_server(path, FakeEngine(), spool)
    try:
        assert stat.S_IMODE(os.lstat(path).st_mode) == 0o660
        reply = await asyncio.to_thread(call, path, {"op": "ping"})
        assert reply == {"ok": True, "pid": os.getpid()}
    finally:
        srv.close()
        await asyncio.wait_for(srv.wait_closed(), TIMEOUT)


async def test_sync_client_errors(server: tuple[ControlServer, FakeEngine], tmp_path: Path) -> None:
    """call() raises DaemonNotRunning without a socket and ControlError on ok=false."""
    srv, _ = server
    missing = tmp_path / "nowhere" / "qmgrd.sock"
    with pytest.raises(DaemonNotRunning, match=f"no control socket at {missing}"):
        await asyncio.to_thread(call, missing, {"op": "ping"})
    with pytest.raises(ControlError, match="unknown op 'nope'"):
        await asyncio.to_thread(call, srv.path, {"op": "nope"})
    reply = await asyncio.to_thread(call, srv.path, {"op": "flush", "destination": "x.test"})
    assert reply == {"ok": True, "messages": 3}


def test_stale_socket_means_not_running(tmp_path: Path) -> None:
    """A socket file without a listener is reported as 'daemon not running'."""
    path = tmp_path / "qmgrd.sock"
    with socket.socket(socket.AF_UNIX) as dead:
        dead.bind(str(path))
    with pytest.raises(DaemonNotRunning):
        call(path, {"op": "ping"}, timeout=5)
