"""SMTP AUTH: password-file hashes, PLAIN/LOGIN on the wire, relay after authentication, logging."""

from __future__ import annotations

import base64
import dataclasses
import ipaddress
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from qmgrd.config import load_config
from qmgrd.errors import ConfigError
from qmgrd.listener import ListenerSettings
from qmgrd.listener.auth import (
    Credentials,
    auth_allowed,
    decode_plain,
    hash_password,
    parse_password_file,
    verify_hash,
)
from qmgrd.log import render_postfix
from tests.support.config import REPO, write_config
from tests.support.listener import Listening, listening, loopback_settings, start_listening

TIMEOUT = 20


def _b64(text: str | bytes) -> str:
    data = text.encode() if isinstance(text, str) else text
    return base64.b64encode(data).decode()


def _creds() -> Credentials:
    # Few iterations: the tests check behaviour, not the cost.
    return parse_password_file(
        "# test accounts\n\n"
        f"alice:{hash_password('wonder land', iterations=1000)}\n"
        f"bob:{hash_password('builder', scheme='scrypt')}\n",
        "test",
    )


SETTINGS = loopback_settings(
    mynetworks=(ipaddress.ip_network("192.0.2.0/24"),),  # the test client is NOT inside
    smtpd_recipient_limit=10,
)


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[Listening]:
    """A listener with AUTH for alice and bob; the test's client is outside mynetworks."""
    async with listening(tmp_path, dataclasses.replace(SETTINGS, sasl_credentials=_creds())) as srv:
        yield srv


# ---------------------------------------------------------------- hashes and the file


@pytest.mark.parametrize("scheme", ["pbkdf2-sha256", "scrypt"])
def test_hash_verifies_only_the_right_password(scheme: str) -> None:
    """A hash matches its password and nothing else, and two hashes of it differ (salt)."""
    first = hash_password("s3cret", scheme=scheme, iterations=1000)
    assert verify_hash("s3cret", first)
    assert not verify_hash("s3cret ", first)
    assert not verify_hash("", first)
    assert first != hash_password("s3cret", scheme=scheme, iterations=1000)


def test_unknown_user_fails_and_known_users_verify() -> None:
    """Credentials answer per user; an unknown user is refused (after a dummy check)."""
    creds = _creds()
    assert creds.verify("alice", "wonder land")
    assert creds.verify("bob", "builder")
    assert not creds.verify("alice", "builder")
    assert not creds.verify("mallory", "wonder land")


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("alice:plaintext\n", "line 1: not a $scheme"),
        ("# c\nalice\n", "line 2: expected user:hash"),
        ("alice:$md5$1$abc$def\n", "unknown scheme"),
        ("alice:$pbkdf2-sha256$0$AAAA$AAAA\n", "bad iteration count"),
        ("alice:$scrypt$n=3,r=8,p=1$AAAA$AAAA\n", "bad scrypt parameters"),
    ],
)
def test_bad_password_file_lines_are_config_errors_naming_the_line(text: str, needle: str) -> None:
    """Plain-text passwords, missing colons and unknown schemes are refused with the line."""
    with pytest.raises(ConfigError, match=r"pw\.txt, line") as info:
        parse_password_file(text, "pw.txt")
    assert needle in str(info.value)


def test_duplicate_user_is_a_config_error() -> None:
    """A user listed twice is an error rather than a silent override."""
    line = f"alice:{hash_password('x', iterations=1000)}\n"
    with pytest.raises(ConfigError, match="duplicate user"):
        parse_password_file(line + line, "pw")


def test_hash_command_prints_a_line_the_file_accepts(tmp_path: Path) -> None:
    """``python -m qmgrd.listener.auth hash USER --stdin`` prints a working user:hash line."""
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "qmgrd.listener.auth",
            "hash",
            "carol",
            "--stdin",
            "--iterations",
            "1000",
        ],
        input="pass word\n",
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=TIMEOUT,
        check=True,
    )
    line = proc.stdout.strip()
    assert line.startswith("carol:$pbkdf2-sha256$1000$")
    assert parse_password_file(line, "out").verify("carol", "pass word")


def test_config_enables_auth_with_a_password_file(tmp_path: Path) -> None:
    """smtpd_sasl_auth_enable loads the file (relative to the config dir); without one it fails."""
    conf = write_config(
        tmp_path, "smtpd_sasl_auth_enable = yes\nsmtpd_sasl_password_file = sasl_passwd\n"
    )
    (conf / "sasl_passwd").write_text(f"alice:{hash_password('pw', iterations=1000)}\n")
    settings = ListenerSettings.from_config(load_config(conf, hostname="mx.test"))
    assert settings.sasl_credentials is not None
    assert settings.sasl_credentials.verify("alice", "pw")
    (conf / "main.cf").write_text("smtpd_sasl_auth_enable = yes\n")
    with pytest.raises(ConfigError, match="smtpd_sasl_password_file"):
        ListenerSettings.from_config(load_config(conf, hostname="mx.test"))
    (conf / "main.cf").write_text("")
    assert ListenerSettings.from_config(load_config(conf)).sasl_credentials is None


def test_auth_offered_only_over_tls_or_loopback() -> None:
    """PLAIN/LOGIN carry clear-text passwords: loopback or TLS only."""
    assert auth_allowed("127.0.0.1", tls=False)
    assert auth_allowed("127.8.9.10", tls=False)
    assert auth_allowed("::1", tls=False)
    assert auth_allowed("::ffff:127.0.0.1", tls=False)
    assert not auth_allowed("192.0.2.7", tls=False)
    assert not auth_allowed("2001:db8::1", tls=False)
    assert not auth_allowed("::ffff:192.0.2.7", tls=False)
    assert not auth_allowed("unknown", tls=False)
    assert auth_allowed("192.0.2.7", tls=True)


def test_plain_response_decoding() -> None:
    """RFC 4616: authzid may be empty or the user; anything else is malformed."""
    assert decode_plain(b"\0alice\0pw") == ("alice", "pw")
    assert decode_plain(b"alice\0alice\0pw") == ("alice", "pw")
    assert decode_plain(b"root\0alice\0pw") is None
    assert decode_plain(b"\0\0pw") is None
    assert decode_plain(b"alice\0pw") is None
    assert decode_plain(b"\0\xff\0pw") is None


# ---------------------------------------------------------------- on the wire


async def test_plain_auth_permits_relay_from_outside_mynetworks(server: Listening) -> None:
    """Before AUTH RCPT gets 554 relay denied; after AUTH PLAIN the same RCPT is accepted,
    the message is queued and the queue log names the SASL user."""
    chat = await server.chat()
    ehlo = await chat.cmd("EHLO client.test")
    assert "250-AUTH PLAIN LOGIN" in ehlo or "250 AUTH PLAIN LOGIN" in ehlo
    with capture_logs() as logs:
        assert (await chat.cmd("MAIL FROM:<s@src.test>")).startswith("250")
        reply = await chat.cmd("RCPT TO:<r@dst.test>")
        assert reply.startswith("554 5.7.1"), reply
        assert (await chat.cmd("RSET")).startswith("250")
        reply = await chat.cmd("AUTH PLAIN " + _b64("\0alice\0wonder land"))
        assert reply.startswith("235 2.7.0"), reply
        assert (await chat.cmd("AUTH PLAIN " + _b64("\0alice\0wonder land"))).startswith("503")
        assert (await chat.cmd("MAIL FROM:<s@src.test>")).startswith("250")
        assert (await chat.cmd("RCPT TO:<r@dst.test>")).startswith("250")
        assert (await chat.cmd("DATA")).startswith("354")
        reply = await chat.cmd("Subject: hi\r\n\r\nhello\r\n.")
        assert reply.startswith("250 2.0.0 Ok: queued as "), reply
    assert len(server.commits) == 1
    reject = next(e for e in logs if e["event"] == "NOQUEUE: reject")
    assert reject["client"] == "unknown[127.0.0.1]" and reject["to"] == "<r@dst.test>"
    queued = next(e for e in logs if e["event"] == "queued")
    assert queued["sasl_username"] == "alice" and queued["sasl_method"] == "PLAIN"
    # the identity is stored in the queue file (fairness key sasl_username)
    assert server.spool.open("incoming", server.commits[0]).sasl_username == "alice"
    await chat.cmd("QUIT")


async def test_login_auth_with_challenges_and_plain_without_initial_response(
    server: Listening,
) -> None:
    """LOGIN asks Username:/Password: in base64; PLAIN without initial response sends 334."""
    chat = await server.chat()
    await chat.cmd("EHLO client.test")
    assert await chat.cmd("AUTH LOGIN") == "334 VXNlcm5hbWU6"
    assert await chat.cmd(_b64("bob")) == "334 UGFzc3dvcmQ6"
    assert (await chat.cmd(_b64("builder"))).startswith("235")
    chat2 = await server.chat()
    await chat2.cmd("EHLO client.test")
    assert await chat2.cmd("AUTH PLAIN") == "334 "
    assert (await chat2.cmd(_b64("\0bob\0builder"))).startswith("235")
    chat3 = await server.chat()
    await chat3.cmd("EHLO client.test")
    assert (await chat3.cmd("AUTH LOGIN " + _b64("bob"))) == "334 UGFzc3dvcmQ6"
    assert (await chat3.cmd("*")).startswith("501 5.7.0")
    assert (await chat3.cmd("AUTH CRAM-MD5")).startswith("504")
    assert (await chat3.cmd("AUTH PLAIN !!notbase64")).startswith("501 5.5.2")


async def test_failed_auth_is_logged_with_client_and_three_failures_disconnect(
    server: Listening,
) -> None:
    """A wrong password gets 535 and a warning naming the client; the third failure gets 421
    and the connection is closed; the session never gained relay rights."""
    chat = await server.chat()
    await chat.cmd("EHLO client.test")
    with capture_logs() as logs:
        for _ in range(2):
            reply = await chat.cmd("AUTH PLAIN " + _b64("\0alice\0wrong"))
            assert reply.startswith("535 5.7.8"), reply
        assert (await chat.cmd("MAIL FROM:<s@src.test>")).startswith("250")
        assert (await chat.cmd("RCPT TO:<r@dst.test>")).startswith("554")
        assert (await chat.cmd("RSET")).startswith("250")
        assert (await chat.cmd("AUTH PLAIN " + _b64("\0mallory\0x"))).startswith("421 4.7.0")
        assert await chat.closed()
    failures = [e for e in logs if e["event"] == "SASL authentication failed"]
    assert [e["sasl_username"] for e in failures] == ["alice", "alice", "mallory"]
    assert all(e["client"] == "unknown[127.0.0.1]" for e in failures)
    assert all(e["log_level"] == "warning" for e in failures)


async def test_control_characters_from_the_network_are_escaped_in_log_lines(
    server: Listening,
) -> None:
    """A user name with CR, LF and ESC is logged as one line with \\r, \\n, \\x1b escapes."""
    chat = await server.chat()
    await chat.cmd("EHLO client.test")
    evil = "bob\r\nwarning: forged line\x1b[2J"
    with capture_logs() as logs:
        assert (await chat.cmd("AUTH PLAIN " + _b64(f"\0{evil}\0x"))).startswith("535")
    event = next(e for e in logs if e["event"] == "SASL authentication failed")
    assert event["sasl_username"] == evil
    line = render_postfix(dict(event))
    assert "\r" not in line and "\n" not in line and "\x1b" not in line
    assert "sasl_username=bob\\r\\nwarning: forged line\\x1b[2J" in line


async def test_auth_disabled_is_not_offered_and_refused(tmp_path: Path) -> None:
    """Without smtpd_sasl_auth_enable EHLO shows no AUTH and AUTH gets 503."""
    srv = await start_listening(tmp_path, SETTINGS)
    try:
        chat = await srv.chat()
        assert "AUTH" not in await chat.cmd("EHLO client.test")
        assert (await chat.cmd("AUTH PLAIN " + _b64("\0alice\0wonder land"))).startswith("503")
    finally:
        await srv.close()


async def test_auth_needs_ehlo_and_no_transaction(server: Listening) -> None:
    """AUTH after HELO (no ESMTP) or inside a MAIL transaction is refused with 503."""
    chat = await server.chat()
    await chat.cmd("HELO client.test")
    assert (await chat.cmd("AUTH PLAIN " + _b64("\0alice\0wonder land"))).startswith("503")
    await chat.cmd("EHLO client.test")
    assert (await chat.cmd("MAIL FROM:<s@src.test>")).startswith("250")
    assert (await chat.cmd("AUTH PLAIN " + _b64("\0alice\0wonder land"))).startswith("503")
