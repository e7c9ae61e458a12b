"""Listener TLS on 127.0.0.1 with trustme certificates: STARTTLS, AUTH over TLS, encrypt,
wrapper mode, and the STARTTLS command-injection defence (CVE-2011-0411)."""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import ipaddress
import ssl
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import trustme

from qmgrd.listener import ListenerSettings
from qmgrd.listener.auth import Credentials, hash_password, parse_password_file
from qmgrd.listener.tls import TlsSettings, build_context
from tests.support.listener import Chat, Listening, listening, loopback_settings
from tests.support.logs import watch_logs
from tests.support.waits import TIMEOUT

PASSWORD = "wonder land 42"


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def _creds() -> Credentials:
    return parse_password_file(f"alice:{hash_password(PASSWORD, iterations=1000)}\n", "test")


def write_cert(ca: trustme.CA, directory: Path, name: str = "server") -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 and its key, written as PEM files; (cert, key)."""
    leaf = ca.issue_cert("127.0.0.1")
    cert, key = directory / f"{name}.crt", directory / f"{name}.key"
    for pem in leaf.cert_chain_pems:
        with cert.open("ab") as f:
            f.write(pem.bytes())
    leaf.private_key_pem.write_to_path(str(key))
    return cert, key


def client_context(ca: trustme.CA) -> ssl.SSLContext:
    """A client context that trusts only the test CA and checks the name 127.0.0.1."""
    ctx = ssl.create_default_context()
    ca.configure_trust(ctx)
    return ctx


def peer_der(chat: Chat) -> bytes:
    """The DER certificate the server presented on the chat's TLS connection."""
    obj = chat.writer.get_extra_info("ssl_object")
    assert obj is not None, "not a TLS connection"
    assert isinstance(obj, ssl.SSLObject)
    der = obj.getpeercert(binary_form=True)
    assert der is not None
    return der


def file_der(cert: Path) -> bytes:
    """The DER form of the first certificate in a PEM file."""
    der: bytes = ssl.PEM_cert_to_DER_cert(cert.read_text())
    return der


def tls_settings(cert: Path, key: Path, **changes: object) -> TlsSettings:
    """Listener TLS at level may with ``cert``/``key`` (``changes`` replace fields)."""
    base = TlsSettings(level="may", context=build_context(cert, key, (), ">=TLSv1.2"))
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


async def open_chat(
    port: int, *, local: str = "127.0.0.1", ctx: ssl.SSLContext | None = None
) -> tuple[Chat, str]:
    """A raw client from ``local`` (127.0.0.2 is outside mynetworks), with its greeting."""
    reader, writer = await asyncio.wait_for(
        asyncio.open_connection(
            "127.0.0.1",
            port,
            local_addr=(local, 0),
            ssl=ctx,
            server_hostname="127.0.0.1" if ctx else None,
        ),
        TIMEOUT,
    )
    chat = Chat(reader, writer)
    return chat, await chat.reply()


async def starttls(chat: Chat, ctx: ssl.SSLContext) -> None:
    """STARTTLS (220 expected) and the client handshake, verifying the server."""
    reply = await chat.cmd("STARTTLS")
    assert reply == "220 2.0.0 Ready to start TLS", reply
    await asyncio.wait_for(chat.writer.start_tls(ctx, server_hostname="127.0.0.1"), TIMEOUT)


async def send_mail(chat: Chat, rcpt: str = "r@dst.test") -> str:
    """One transaction; the reply to the end of DATA."""
    assert (await chat.cmd("MAIL FROM:<s@src.test>")).startswith("250")
    reply = await chat.cmd(f"RCPT TO:<{rcpt}>")
    assert reply.startswith("250"), reply
    assert (await chat.cmd("DATA")).startswith("354")
    return await chat.cmd("Subject: t\r\n\r\nhello\r\n.")


@pytest.fixture
def cert_files(ca: trustme.CA, tmp_path: Path) -> tuple[Path, Path]:
    """A certificate and key for 127.0.0.1 from the test CA."""
    return write_cert(ca, tmp_path)


@pytest.fixture
async def tls_server(tmp_path: Path, cert_files: tuple[Path, Path]) -> AsyncIterator[Listening]:
    """A listener at level may with AUTH; only 127.0.0.1 is in mynetworks."""
    settings = loopback_settings(
        tls=tls_settings(*cert_files), sasl_credentials=_creds(), smtpd_recipient_limit=10
    )
    async with listening(tmp_path, settings) as srv:
        yield srv


async def test_starttls_presents_the_configured_certificate(
    tls_server: Listening, ca: trustme.CA, cert_files: tuple[Path, Path]
) -> None:
    """STARTTLS is offered, the client verifies the configured certificate, EHLO starts
    again without STARTTLS, and mail is queued over TLS with the session's protocol logged."""
    chat, _ = await open_chat(tls_server.port)
    try:
        assert "250-STARTTLS" in await chat.cmd("EHLO client.test")
        with watch_logs() as logs:
            await starttls(chat, client_context(ca))
            assert peer_der(chat) == file_der(cert_files[0])
            assert (await chat.cmd("MAIL FROM:<s@src.test>")).startswith("503 5.5.1"), "EHLO again"
            ehlo = await chat.cmd("EHLO client.test")
            assert "STARTTLS" not in ehlo
            assert (await chat.cmd("STARTTLS")).startswith("554 5.5.1")
            reply = await send_mail(chat, "r@mx.test")
            assert reply.startswith("250 2.0.0 Ok: queued as "), reply
        established = logs.events("Anonymous TLS connection established")
        assert established and str(established[0]["protocol"]).startswith("TLSv1.")
        assert established[0]["cipher"]
    finally:
        await chat.close()
    assert len(tls_server.commits) == 1


async def test_auth_needs_tls_for_a_client_outside_loopback(
    tls_server: Listening, ca: trustme.CA
) -> None:
    """From 127.0.0.2 AUTH is neither offered nor accepted in clear text; after STARTTLS
    it is, and the authenticated client may relay; no log event carries the password."""
    chat, _ = await open_chat(tls_server.port, local="127.0.0.2")
    try:
        with watch_logs() as logs:
            assert "AUTH" not in await chat.cmd("EHLO client.test")
            reply = await chat.cmd("AUTH PLAIN " + _b64(f"\0alice\0{PASSWORD}"))
            assert reply.startswith("503 5.5.1"), reply
            await starttls(chat, client_context(ca))
            assert "250-AUTH PLAIN LOGIN" in await chat.cmd("EHLO client.test")
            reply = await chat.cmd("AUTH PLAIN " + _b64("\0alice\0wrong"))
            assert reply.startswith("535 5.7.8"), reply
            reply = await chat.cmd("AUTH PLAIN " + _b64(f"\0alice\0{PASSWORD}"))
            assert reply.startswith("235 2.7.0"), reply
            reply = await send_mail(chat)
            assert reply.startswith("250 2.0.0 Ok: queued as "), reply
        assert any(e["event"] == "authenticated" for e in logs)
        text = repr(list(logs))
        assert PASSWORD not in text and _b64(f"\0alice\0{PASSWORD}") not in text
        assert "wrong" not in text
    finally:
        await chat.close()


async def test_loopback_client_keeps_clear_text_auth_unless_auth_only(
    tmp_path: Path, cert_files: tuple[Path, Path], ca: trustme.CA
) -> None:
    """A loopback client gets AUTH without TLS by default; with smtpd_tls_auth_only it
    must STARTTLS first."""
    settings = loopback_settings(tls=tls_settings(*cert_files), sasl_credentials=_creds())
    async with listening(tmp_path / "a", settings) as srv:
        chat = await srv.chat()
        assert "AUTH PLAIN LOGIN" in await chat.cmd("EHLO client.test")
    only = dataclasses.replace(settings, tls=tls_settings(*cert_files, auth_only=True))
    async with listening(tmp_path / "b", only) as srv:
        chat = await srv.chat()
        assert "AUTH" not in await chat.cmd("EHLO client.test")
        assert (await chat.cmd("AUTH PLAIN " + _b64(f"\0alice\0{PASSWORD}"))).startswith("503")
        await starttls(chat, client_context(ca))
        assert "AUTH PLAIN LOGIN" in await chat.cmd("EHLO client.test")


async def test_encrypt_refuses_mail_before_starttls(
    tmp_path: Path, cert_files: tuple[Path, Path], ca: trustme.CA
) -> None:
    """At level encrypt MAIL gets 530 5.7.0 before STARTTLS and is accepted after it."""
    settings = loopback_settings(tls=tls_settings(*cert_files, level="encrypt"))
    async with listening(tmp_path, settings) as srv:
        chat = await srv.chat()
        assert "250-STARTTLS" in await chat.cmd("EHLO client.test")
        reply = await chat.cmd("MAIL FROM:<s@src.test>")
        assert reply == "530 5.7.0 Must issue a STARTTLS command first", reply
        await starttls(chat, client_context(ca))
        await chat.cmd("EHLO client.test")
        assert (await send_mail(chat, "r@mx.test")).startswith("250 2.0.0 Ok: queued as ")
        assert len(srv.commits) == 1


async def test_commands_pipelined_with_starttls_are_discarded(
    tls_server: Listening, ca: trustme.CA
) -> None:
    """Clear-text commands sent in the same packet as STARTTLS are never executed
    (CVE-2011-0411): after the handshake RCPT finds no MAIL, and nothing is queued."""
    chat, _ = await open_chat(tls_server.port)
    try:
        await chat.cmd("EHLO client.test")
        chat.writer.write(b"STARTTLS\r\nMAIL FROM:<evil@src.test>\r\nRCPT TO:<r@mx.test>\r\n")
        assert await chat.reply() == "220 2.0.0 Ready to start TLS"
        await asyncio.wait_for(
            chat.writer.start_tls(client_context(ca), server_hostname="127.0.0.1"), TIMEOUT
        )
        assert (await chat.cmd("EHLO client.test")).startswith("250-mx.test")
        reply = await chat.cmd("RCPT TO:<r@mx.test>")
        assert reply == "503 5.5.1 Error: need MAIL command", reply
        assert (await chat.cmd("QUIT")).startswith("221")
    finally:
        await chat.close()
    assert tls_server.commits == [] and tls_server.ids() == []


async def test_wrapper_mode_speaks_tls_from_the_first_byte(
    tmp_path: Path, cert_files: tuple[Path, Path], ca: trustme.CA
) -> None:
    """In wrapper mode (SMTPS) the greeting comes over TLS with the configured certificate,
    STARTTLS is not offered, and a client outside loopback may AUTH at once."""
    settings = loopback_settings(
        tls=tls_settings(*cert_files, level="none", wrappermode=True),
        sasl_credentials=_creds(),
    )
    async with listening(tmp_path, settings) as srv:
        chat, greeting = await open_chat(srv.port, local="127.0.0.2", ctx=client_context(ca))
        try:
            assert greeting.startswith("220 mx.test")
            assert peer_der(chat) == file_der(cert_files[0])
            ehlo = await chat.cmd("EHLO client.test")
            assert "STARTTLS" not in ehlo and "AUTH PLAIN LOGIN" in ehlo
            reply = await chat.cmd("AUTH PLAIN " + _b64(f"\0alice\0{PASSWORD}"))
            assert reply.startswith("235"), reply
        finally:
            await chat.close()
        # A clear-text client gets no greeting; the session ends and the listener serves on.
        reader, writer = await asyncio.open_connection("127.0.0.1", srv.port)
        writer.write(b"EHLO plain.test\r\n")
        assert await asyncio.wait_for(reader.read(), TIMEOUT) == b""
        writer.close()


async def test_failed_handshake_ends_only_that_session(
    tls_server: Listening, ca: trustme.CA
) -> None:
    """A client that does not trust the certificate aborts the handshake: that session ends
    (logged as an SSL_accept error or a lost connection after STARTTLS) and the next client
    is served."""
    chat, _ = await open_chat(tls_server.port)
    await chat.cmd("EHLO client.test")
    untrusting = ssl.create_default_context()  # does not trust the test CA
    untrusting.maximum_version = ssl.TLSVersion.TLSv1_2  # so the server sees the failure
    with watch_logs() as logs:
        with pytest.raises(ssl.SSLError):
            await starttls(chat, untrusting)
        chat.writer.transport.abort()

        def ended() -> bool:
            return bool(logs.events("SSL_accept error")) or any(
                e.get("after") == "STARTTLS" for e in logs.events("lost connection")
            )

        await logs.wait_for(ended, "the session's end after STARTTLS")
    chat2 = await tls_server.chat()
    assert (await chat2.cmd("NOOP")).startswith("250")


def test_settings_without_a_certificate_are_refused() -> None:
    """A TLS level above none without a context is a configuration error, not a crash later."""
    from qmgrd.errors import ConfigError

    with pytest.raises(ConfigError, match="needs a certificate"):
        TlsSettings(level="may")
    settings = ListenerSettings(
        listen=(("127.0.0.1", 0),),
        myhostname="mx.test",
        mynetworks=(ipaddress.ip_network("127.0.0.1/32"),),
        message_size_limit=0,
        smtpd_recipient_limit=1,
        smtpd_timeout=1,
    )
    assert settings.tls.level == "none" and not settings.tls.starttls


async def test_session_facts_for_the_received_header(tls_server: Listening, ca: trustme.CA) -> None:
    """The session knows its RFC 3848 ``with`` keyword: ESMTP in clear, ESMTPSA after
    STARTTLS and AUTH, with the TLS protocol and cipher at hand."""
    chat, _ = await open_chat(tls_server.port)
    try:
        await chat.cmd("EHLO client.test")
        (session,) = tls_server.handle.sessions
        assert session.with_protocol == "ESMTP" and session.tls is None
        await starttls(chat, client_context(ca))
        await chat.cmd("EHLO client.test")
        assert session.with_protocol == "ESMTPS"
        assert (await chat.cmd("AUTH PLAIN " + _b64(f"\0alice\0{PASSWORD}"))).startswith("235")
        assert session.with_protocol == "ESMTPSA"
        assert session.tls is not None and session.tls.protocol.startswith("TLSv1.")
        assert session.tls.cipher and session.tls.bits >= 128
    finally:
        await chat.close()
