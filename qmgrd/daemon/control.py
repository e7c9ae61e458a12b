"""The control socket: how ``qmgrd flush|status|hold|...`` talk to the running daemon.

Contract
--------
``start_control_server(path, engine, spool) -> ControlServer`` binds a Unix
stream socket at ``path`` (normally ``control_socket_path(queue_directory)``,
i.e. ``<queue_directory>/public/qmgrd.sock``), mode 0660, after removing a
stale socket left by a dead daemon. It refuses to replace a socket that still
answers (another daemon owns this spool). ``close()`` stops accepting and
hangs up on idle clients; ``await wait_closed()`` returns once every client
handler has ended.

Protocol: one JSON object per line each way. Requests::

    {"op": "ping"}                                  -> {"ok": true, "pid": N}
    {"op": "flush"}                                 -> {"ok": true}
    {"op": "flush", "destination": "example.com"}   -> {"ok": true, "messages": N}
    {"op": "flush", "queue_id": "ID"}               -> {"ok": true, "found": bool}
    {"op": "scan"}                                  -> {"ok": true}
    {"op": "status"}                                -> {"ok": true, "pid": N, "queue_files":
                                                        {"incoming": N, ...},
                                                        ...EngineStatus.to_json()}
    {"op": "hold"|"release"|"delete"|"requeue"|"expire", "ids": [ID, ...] | "ALL"[, "queue": Q]}
                                                    -> {"ok": true, "results": {ID: result}}

The operation names and results are ``qmgrd.ops.operation.Operation`` and
``OpResult``: ``"ok"``, ``"not found"``, ``"pending"`` (the message is being
delivered; the operation is already on disk, so a restart honours it, and the
engine completes it when that pass ends) or ``"error: ..."``. Any request
the server cannot honour gets ``{"ok": false, "error": "one line"}`` and
the connection stays usable; a line longer than ``max_line`` bytes, or a client silent for
``client_timeout`` seconds, gets its connection closed. Nothing a client
sends can stop the daemon: an unexpected exception from the engine is logged
and answered as ``internal error``.

Why a line protocol over a Unix socket: access control is the file mode of
the socket (the spool's owner and group), the CLI needs no dependency to
speak it, and ``socat``/``nc -U`` can drive it by hand.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import stat
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

from qmgrd.daemon.control_socket import (
    SOCKET_MODE,
    SOCKET_NAME,
    control_socket_path,
    remove_stale_socket,
    unix_address,
)
from qmgrd.daemon.snapshot import EngineStatus, StatusReply
from qmgrd.errors import InvariantError, QmgrdError, SpoolError
from qmgrd.log import get_logger
from qmgrd.ops.operation import Operation
from qmgrd.spool import QUEUES, Spool, is_queue_id

__all__ = [
    "CLIENT_TIMEOUT",
    "MAX_CLIENTS",
    "MAX_IDS",
    "MAX_LINE",
    "SOCKET_MODE",
    "SOCKET_NAME",
    "ControlServer",
    "EngineControl",
    "Operation",
    "control_socket_path",
    "start_control_server",
    "unix_address",
]

MAX_LINE = 64 * 1024  # bytes per request line, newline included
MAX_IDS = 2000  # queue ids per operation request (a full line holds ~3500)
CLIENT_TIMEOUT = 30.0  # seconds a client may stay silent before it is hung up on
MAX_CLIENTS = 64  # concurrent connections; more are answered with an error and closed

_FIELDS: dict[str, frozenset[str]] = {
    "ping": frozenset(),
    "flush": frozenset({"destination", "queue_id"}),
    "scan": frozenset(),
    "status": frozenset(),
    **{op.value: frozenset({"ids", "queue"}) for op in Operation},
}


class EngineControl(Protocol):
    """What the control server needs from the engine (implemented by ``Engine``)."""

    def flush(self) -> None:
        """``postqueue -f``: unthrottle everything, rescan deferred/ ignoring retry times."""

    async def flush_destination(self, domain: str) -> int:
        """Unthrottle ``domain`` and retry deferred mail with a recipient there; count."""

    async def flush_message(self, queue_id: str) -> bool:
        """Retry one deferred message now; False if it is not in deferred/."""

    def request_incoming_scan(self) -> None:
        """Look at incoming/ again."""

    def snapshot(self) -> EngineStatus:
        """The typed snapshot of what is in core."""

    async def operate(
        self, op: Operation, queue_ids: Sequence[str] | None, *, queue: str | None = None
    ) -> dict[str, str]:
        """hold/release/delete/requeue (None = ALL, or ALL of ``queue``); a result per id."""


class ControlServer:
    """A listening control socket and its client handlers (see the module doc)."""

    def __init__(
        self,
        path: Path,
        engine: EngineControl,
        spool: Spool,
        *,
        client_timeout: float,
        max_line: int,
        max_clients: int,
    ) -> None:
        self.path = path
        self.engine = engine
        self.spool = spool
        self.client_timeout = client_timeout
        self.max_line = max_line
        self.max_clients = max_clients
        self.log = get_logger("control")
        self._server: asyncio.AbstractServer | None = None
        self._handlers: set[asyncio.Task[Any]] = set()
        self._writers: set[asyncio.StreamWriter] = set()
        self._closing = False
        self._handlers_done = asyncio.Event()
        self._handlers_done.set()

    # ------------------------------------------------------------------ lifecycle

    async def _start(self) -> None:
        await remove_stale_socket(self.path)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            with unix_address(self.path) as address:
                sock.bind(address)
            os.chmod(self.path, SOCKET_MODE)  # after bind: the umask applied to bind()
            sock.setblocking(False)
            self._server = await asyncio.start_unix_server(
                self._client, sock=sock, limit=self.max_line
            )
        except OSError as exc:
            sock.close()
            with contextlib.suppress(OSError):
                os.unlink(self.path)
            raise SpoolError(f"cannot listen on control socket {self.path}: {exc}") from exc

    def close(self) -> None:
        """Stop accepting, remove the socket file and hang up on every client."""
        if self._closing:
            return
        self._closing = True
        if self._server is not None:
            self._server.close()
        with contextlib.suppress(OSError):
            if stat.S_ISSOCK(os.lstat(self.path).st_mode):
                os.unlink(self.path)
        for writer in list(self._writers):
            writer.close()

    async def wait_closed(self) -> None:
        """Wait until the listener and every client handler have ended (after ``close``)."""
        if self._server is not None:
            await self._server.wait_closed()
        await self._handlers_done.wait()

    # ------------------------------------------------------------------ clients

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._handlers.add(task)
        self._writers.add(writer)
        self._handlers_done.clear()
        try:
            if len(self._writers) > self.max_clients:
                await self._reply(writer, _error("too many control clients; try again"))
                return
            await self._serve_client(reader, writer)
        except (ConnectionError, TimeoutError):
            pass  # the client went away or stalled: nothing to tell it
        finally:
            self._writers.discard(writer)
            self._handlers.discard(task)
            writer.close()
            with contextlib.suppress(ConnectionError, TimeoutError):
                await asyncio.wait_for(writer.wait_closed(), self.client_timeout)
            if not self._handlers:
                self._handlers_done.set()

    async def _serve_client(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        while not self._closing:
            try:
                line = await asyncio.wait_for(reader.readline(), self.client_timeout)
            except ValueError:  # LimitOverrunError: no way to find the next request
                await self._reply(writer, _error(f"request longer than {self.max_line} bytes"))
                return
            except TimeoutError:
                return
            if not line:
                return
            if not line.strip():
                continue
            reply = await self._handle_line(line)
            await self._reply(writer, reply)

    async def _reply(self, writer: asyncio.StreamWriter, reply: dict[str, Any]) -> None:
        writer.write(json.dumps(reply, separators=(",", ":")).encode("ascii") + b"\n")
        await asyncio.wait_for(writer.drain(), self.client_timeout)

    async def _handle_line(self, line: bytes) -> dict[str, Any]:
        try:
            request = json.loads(line)
        except (ValueError, UnicodeDecodeError):
            return _error("request is not valid JSON")
        try:
            return await self._dispatch(request)
        except _BadRequest as exc:
            return _error(str(exc))
        except InvariantError as exc:
            self.log.error("invariant broken in control request", op=_op_of(request),
                           error=str(exc))
            return _error(f"internal error: {exc}")
        except (QmgrdError, ValueError) as exc:
            self.log.warning("control request failed", op=_op_of(request), error=str(exc))
            return _error(str(exc))
        except Exception as exc:  # a bug must not take the daemon down with it
            self.log.error("internal error in control request", op=_op_of(request),
                           error=repr(exc))
            return _error(f"internal error: {exc!r}")

    # ------------------------------------------------------------------ requests

    async def _dispatch(self, request: Any) -> dict[str, Any]:
        if not isinstance(request, dict):
            raise _BadRequest("request must be a JSON object")
        op = request.get("op")
        if not isinstance(op, str) or op not in _FIELDS:
            known = ", ".join(sorted(_FIELDS))
            raise _BadRequest(f"unknown op {op!r} (expected one of: {known})")
        extra = set(request) - {"op"} - _FIELDS[op]
        if extra:
            raise _BadRequest(f"unexpected field(s) for {op}: {', '.join(sorted(extra))}")
        if op == "ping":
            return {"ok": True, "pid": os.getpid()}
        if op == "flush":
            return await self._flush(request)
        if op == "scan":
            self.engine.request_incoming_scan()
            self.log.info("incoming scan requested by the operator")
            return {"ok": True}
        if op == "status":
            return await self._status()
        return await self._operate(op, request.get("ids"), request.get("queue"))

    async def _flush(self, request: dict[str, Any]) -> dict[str, Any]:
        destination = request.get("destination")
        queue_id = request.get("queue_id")
        if destination is not None and queue_id is not None:
            raise _BadRequest("flush takes a destination or a queue_id, not both")
        if destination is not None:
            if not isinstance(destination, str) or not destination.strip():
                raise _BadRequest("destination must be a non-empty string")
            count = await self.engine.flush_destination(destination)
            self.log.info("flush requested", destination=destination, messages=count)
            return {"ok": True, "messages": count}
        if queue_id is not None:
            if not isinstance(queue_id, str) or not is_queue_id(queue_id):
                raise _BadRequest(f"not a queue id: {queue_id!r}")
            found = await self.engine.flush_message(queue_id)
            self.log.info("flush requested", queue_id=queue_id, found=found)
            return {"ok": True, "found": found}
        self.engine.flush()
        self.log.info("flush requested")
        return {"ok": True}

    async def _status(self) -> dict[str, Any]:
        counts = await asyncio.to_thread(_count_files, self.spool)
        reply = StatusReply(os.getpid(), tuple(counts.items()), self.engine.snapshot())
        return {"ok": True, **reply.to_json()}

    async def _operate(self, op: str, ids: Any, queue: Any) -> dict[str, Any]:
        operation = _operation(op)
        if queue is not None:
            if ids != "ALL":
                raise _BadRequest('queue is only allowed with "ids": "ALL"')
            if not isinstance(queue, str) or queue not in operation.sources:
                known = ", ".join(operation.sources)
                raise _BadRequest(f"{op} takes a queue among {known}, not {queue!r}")
            results = await self.engine.operate(operation, None, queue=queue)
            return {"ok": True, "results": results}
        queue_ids: list[str] | None
        if ids == "ALL":
            queue_ids = None
        elif isinstance(ids, list):
            if not ids:
                raise _BadRequest("ids is empty")
            if len(ids) > MAX_IDS:
                raise _BadRequest(f"more than {MAX_IDS} ids in one request")
            bad = [i for i in ids if not isinstance(i, str) or not is_queue_id(i)]
            if bad:
                raise _BadRequest(f"not a queue id: {bad[0]!r}")
            queue_ids = list(dict.fromkeys(ids))
        else:
            raise _BadRequest('ids must be a list of queue ids or "ALL"')
        results = await self.engine.operate(operation, queue_ids)
        return {"ok": True, "results": results}


class _BadRequest(Exception):
    """A request the server refuses; the message is the reply's error text."""


def _operation(op: str) -> Operation:
    try:
        return Operation.parse(op)
    except ValueError as exc:
        raise _BadRequest(str(exc)) from None


def _error(text: str) -> dict[str, Any]:
    return {"ok": False, "error": text}


def _op_of(request: Any) -> str:
    op = request.get("op") if isinstance(request, dict) else None
    return op if isinstance(op, str) else "?"


def _count_files(spool: Spool) -> dict[str, int]:
    """Files per queue directory (worker thread: a directory scan each)."""
    return {queue: len(spool.list_ids(queue)) for queue in QUEUES}


async def start_control_server(
    path: Path,
    engine: EngineControl,
    spool: Spool,
    *,
    client_timeout: float = CLIENT_TIMEOUT,
    max_line: int = MAX_LINE,
    max_clients: int = MAX_CLIENTS,
) -> ControlServer:
    """Bind the control socket at ``path`` and serve ``engine`` (see the module doc).

    SpoolError if the socket cannot be created or another daemon answers on it.
    """
    server = ControlServer(
        path,
        engine,
        spool,
        client_timeout=client_timeout,
        max_line=max_line,
        max_clients=max_clients,
    )
    await server._start()
    return server
