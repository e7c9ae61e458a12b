"""The refusal (``qmgrd.listener.accepting.refuse``): one send and a close, on loopback; the
accept queue's count (``queued``) and the accepted socket's family and type."""

from __future__ import annotations

import asyncio
import socket
import sys
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from qmgrd.listener.accepting import UNAVAILABLE, Acceptor, queued, refuse

_WAIT = 5.0  # seconds a blocking read may take at most (the reply is sent before it starts)


@contextmanager
def _accepted() -> Iterator[tuple[socket.socket, socket.socket]]:
    """A connected pair over loopback: (the server's accepted socket, the client's)."""
    with socket.create_server(("127.0.0.1", 0)) as lsock:
        client = socket.create_connection(lsock.getsockname()[:2], timeout=_WAIT)
        conn, _ = lsock.accept()
        try:
            yield conn, client
        finally:
            conn.close()
            client.close()


def _read_to_end(sock: socket.socket) -> bytes:
    data = b""
    for _ in range(100):  # bounded: the reply is one short line
        chunk = sock.recv(4096)
        if not chunk:
            return data
        data += chunk
    raise AssertionError(f"no end of stream after {data!r}")


def test_the_client_reads_the_reply_line_then_the_end_of_the_stream() -> None:
    with _accepted() as (conn, client):
        refuse(conn, UNAVAILABLE)
        assert conn.fileno() == -1  # closed by refuse
        assert _read_to_end(client) == b"421 4.3.2 Service currently unavailable\r\n"


def test_a_text_reply_gets_its_line_end() -> None:
    with _accepted() as (conn, client):
        refuse(conn, "421 4.7.0 relay.test Error: too many connections from 127.0.0.1")
        assert _read_to_end(client) == (
            b"421 4.7.0 relay.test Error: too many connections from 127.0.0.1\r\n"
        )


def test_a_client_that_is_gone_already_costs_no_error() -> None:
    with _accepted() as (conn, client):
        client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        client.close()  # linger 0: a reset, the server's send fails
        refuse(conn, UNAVAILABLE)
        refuse(conn, UNAVAILABLE)  # and on a closed socket too
        assert conn.fileno() == -1


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="TCP_INFO's queue: Linux")
def test_queued_counts_the_clients_waiting_to_be_accepted() -> None:
    with socket.create_server(("127.0.0.1", 0)) as lsock:
        assert queued(lsock) == 0
        clients = [socket.create_connection(lsock.getsockname()[:2], timeout=_WAIT)]
        clients.append(socket.create_connection(lsock.getsockname()[:2], timeout=_WAIT))
        try:
            assert queued(lsock) == 2  # connect returns once the kernel queued it
            conn, _ = lsock.accept()
            conn.close()
            assert queued(lsock) == 1
        finally:
            for client in clients:
                client.close()


def test_queued_is_unknown_for_a_socket_that_is_not_listening_tcp() -> None:
    left, right = socket.socketpair()
    with left, right:
        assert queued(left) == -1


def test_an_accepted_socket_reads_its_family_and_type_as_ints() -> None:
    async def main() -> tuple[object, object, bytes]:
        loop = asyncio.get_running_loop()
        got: asyncio.Future[socket.socket] = loop.create_future()

        def admit(conn: socket.socket, addr: str) -> bool:
            got.set_result(conn)
            return True

        lsock = socket.create_server(("127.0.0.1", 0))
        lsock.setblocking(False)
        acceptor = Acceptor(loop, admit, batch=4)
        acceptor.listen(lsock)
        client = socket.create_connection(lsock.getsockname()[:2], timeout=_WAIT)
        try:
            conn = await asyncio.wait_for(got, _WAIT)
            with conn:
                conn.sendall(b"hi")
                data = client.recv(10)
                return conn.family, conn.type, data
        finally:
            client.close()
            acceptor.close()

    family, kind, data = asyncio.run(main())
    assert (type(family), type(kind)) == (int, int)
    assert (family, kind) == (socket.AF_INET, socket.SOCK_STREAM)
    assert data == b"hi"
