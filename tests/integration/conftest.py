"""Integration fixtures: real TLS on 127.0.0.1 with ``trustme``, and ``no_leaks``."""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import AsyncIterator

import pytest
import trustme

from tests.support.scripted import open_fds
from tests.support.waits import wait_until


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    """A throwaway certificate authority."""
    return trustme.CA()


@pytest.fixture
def server_tls(ca: trustme.CA) -> ssl.SSLContext:
    """A server context with a certificate for 127.0.0.1 signed by the test CA."""
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(ctx)
    return ctx


@pytest.fixture
async def no_leaks() -> AsyncIterator[None]:
    """Fail the test if it leaves asyncio tasks or file descriptors behind."""
    await asyncio.sleep(0)  # one loop turn: tasks the fixture setup scheduled start
    tasks, fds = len(asyncio.all_tasks()), open_fds()
    yield
    # Transports finish closing on later loop turns, with no event to wait on: a bounded poll.
    with contextlib.suppress(AssertionError):
        await wait_until(
            lambda: len(asyncio.all_tasks()) == tasks and open_fds() == fds, "tasks and fds", 2.0
        )
    assert len(asyncio.all_tasks()) == tasks, asyncio.all_tasks()
    assert open_fds() == fds
