"""The metrics endpoint: ``GET /metrics`` over a minimal HTTP/1.0 server on the daemon's loop.

Contract
--------
``await start_metrics_server(host, port, metrics) -> MetricsServer`` listens
on ``host:port`` (OSError if it cannot bind; the caller names
``metrics_listen``) and answers one request per connection: ``GET``/``HEAD``
``/metrics`` with ``metrics.render()`` (the text exposition), ``/`` with a
link, anything else 404/405/400/431. A request must arrive within 10 s and
fit in 8 KiB. A scrape that fails (a broken snapshot) answers 500 and the
endpoint keeps serving. ``MetricsServer``: ``port``, ``sockets``, ``close()``,
``await wait_closed()``, ``await aclose()``.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING

from prometheus_client.exposition import CONTENT_TYPE_LATEST

from qmgrd.log import get_logger

if TYPE_CHECKING:
    from qmgrd.daemon.metrics import Metrics

__all__ = ["MetricsServer", "start_metrics_server"]

_REQUEST_TIMEOUT = 10.0
_MAX_REQUEST = 8192


class MetricsServer:
    """A running endpoint: ``port`` (the bound one), ``close()``, ``await wait_closed()``."""

    def __init__(self, server: asyncio.Server) -> None:
        """Wraps the asyncio server returned by ``start_server``."""
        self._server = server

    @property
    def sockets(self) -> tuple[tuple[str, int], ...]:
        """The bound (host, port) pairs."""
        return tuple(s.getsockname()[:2] for s in self._server.sockets)

    @property
    def port(self) -> int:
        """The bound port (useful when started on port 0)."""
        return self.sockets[0][1]

    def close(self) -> None:
        """Stop accepting scrapes."""
        self._server.close()

    async def wait_closed(self) -> None:
        """Wait until the listening socket is closed."""
        await self._server.wait_closed()

    async def aclose(self) -> None:
        """``close()`` then ``wait_closed()``."""
        self.close()
        await self.wait_closed()


async def start_metrics_server(host: str, port: int, metrics: Metrics) -> MetricsServer:
    """Listen on ``host:port`` and serve ``GET /metrics`` from ``metrics`` on this loop.

    Raises OSError if the address cannot be bound (the caller turns it into
    a ConfigError naming ``metrics_listen``).
    """
    log = get_logger("master")

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await asyncio.wait_for(_serve_one(reader, writer, metrics), _REQUEST_TIMEOUT)
        except (TimeoutError, ConnectionError, asyncio.IncompleteReadError):
            pass
        except Exception as exc:  # a broken status_fn must not kill the endpoint
            log.error("metrics scrape failed", error=repr(exc))
            with contextlib.suppress(ConnectionError):
                await _respond(writer, 500, b"internal error\n", "text/plain; charset=utf-8")
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()

    server = await asyncio.start_server(handle, host, port, limit=_MAX_REQUEST)
    handle_ = MetricsServer(server)
    log.info("metrics endpoint listening", address=_fmt_address(handle_.sockets[0]))
    return handle_


def _fmt_address(addr: tuple[str, int]) -> str:
    host, port = addr
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


async def _serve_one(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, metrics: Metrics
) -> None:
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.LimitOverrunError:
        await _respond(writer, 431, b"request too large\n", "text/plain; charset=utf-8")
        return
    request_line = head.split(b"\r\n", 1)[0].decode("latin-1")
    parts = request_line.split()
    if len(parts) != 3 or not parts[2].startswith("HTTP/"):
        await _respond(writer, 400, b"bad request\n", "text/plain; charset=utf-8")
        return
    method, target = parts[0], parts[1].split("?", 1)[0]
    if method not in ("GET", "HEAD"):
        await _respond(writer, 405, b"method not allowed\n", "text/plain; charset=utf-8")
        return
    if target == "/metrics":
        body = await metrics.render()
        await _respond(writer, 200, body, CONTENT_TYPE_LATEST, head_only=method == "HEAD")
    elif target == "/":
        page = b'<html><body><a href="/metrics">/metrics</a></body></html>\n'
        await _respond(writer, 200, page, "text/html; charset=utf-8", head_only=method == "HEAD")
    else:
        await _respond(writer, 404, b"not found\n", "text/plain; charset=utf-8")


_REASONS = {
    200: "OK",
    400: "Bad Request",
    404: "Not Found",
    405: "Method Not Allowed",
    431: "Request Header Fields Too Large",
    500: "Internal Server Error",
}


async def _respond(
    writer: asyncio.StreamWriter,
    code: int,
    body: bytes,
    content_type: str,
    *,
    head_only: bool = False,
) -> None:
    header = (
        f"HTTP/1.0 {code} {_REASONS[code]}\r\n"
        f"Content-Type: {content_type}\r\n"
        f"Content-Length: {len(body)}\r\n"
        "Connection: close\r\n\r\n"
    ).encode()
    writer.write(header if head_only else header + body)
    await writer.drain()
