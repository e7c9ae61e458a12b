"""Fixtures shared by the integration tests: real TLS on 127.0.0.1 with ``trustme``."""

from __future__ import annotations

import ssl

import pytest
import trustme


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
