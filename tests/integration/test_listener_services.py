"""master.cf inet listeners and listener TLS through ``assemble.Daemon``: a submission
listener with its -o overrides and maxproc, a certificate renewed by reload, and
certificate errors refused at start and at reload."""

from __future__ import annotations

import asyncio
import re
import signal
import ssl
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import trustme

from qmgrd.config import load_config
from qmgrd.daemon.assemble import Daemon
from qmgrd.errors import ConfigError
from qmgrd.listener.auth import hash_password
from qmgrd.listener.services import listener_settings
from tests.integration.test_listener_tls import (
    PASSWORD,
    _b64,
    client_context,
    file_der,
    open_chat,
    peer_der,
    starttls,
    write_cert,
)
from tests.support.clock import FakeClock
from tests.support.config import write_config
from tests.support.logs import watch_logs
from tests.support.process import DaemonProcess, running_daemon_process
from tests.support.waits import TIMEOUT

SUBMISSION = (
    "127.0.0.1:0 inet n - n - 1 smtpd"
    " -o smtpd_tls_security_level=encrypt"
    " -o smtpd_sasl_auth_enable=yes"
    " -o smtpd_sasl_password_file=sasl_passwd\n"
)


def tls_main(cert: Path, key: Path) -> str:
    """main.cf lines: mynetworks 127.0.0.1 only, the certificate and key, no TLS level."""
    return f"mynetworks = 127.0.0.1/32\nsmtpd_tls_cert_file = {cert}\nsmtpd_tls_key_file = {key}\n"


@pytest.fixture
async def started(tmp_path: Path) -> AsyncIterator[list[Daemon]]:
    """Holds the daemons a test starts and stops them afterwards."""
    daemons: list[Daemon] = []
    yield daemons
    for daemon in daemons:
        await asyncio.wait_for(daemon.stop(), TIMEOUT)


async def start(conf: Path, daemons: list[Daemon]) -> Daemon:
    """A daemon for ``conf`` (fake clock, no fsync), started and registered for stopping."""
    daemon = Daemon(load_config(conf, hostname="mx.test"), clock=FakeClock(), fsync=False)
    await asyncio.wait_for(daemon.start(), TIMEOUT)
    daemons.append(daemon)
    return daemon


async def test_submission_listener_from_master_cf_with_its_overrides(
    tmp_path: Path, ca: trustme.CA, started: list[Daemon]
) -> None:
    """An inet line starts its own listener: its -o settings (encrypt, AUTH) apply there and
    not to the main listener, AUTH from 127.0.0.2 works after STARTTLS and lets the client
    relay, and its maxproc (1) caps its sessions."""
    cert, key = write_cert(ca, tmp_path)
    conf = write_config(tmp_path, tls_main(cert, key), master=SUBMISSION)
    (conf / "sasl_passwd").write_text(f"alice:{hash_password(PASSWORD, iterations=1000)}\n")
    daemon = await start(conf, started)
    assert daemon.listener is not None and list(daemon.services) == ["127.0.0.1:0"]
    main_port = daemon.listener.addresses[0][1]
    sub_port = daemon.services["127.0.0.1:0"].addresses[0][1]
    assert main_port != sub_port

    plain, _ = await open_chat(main_port)
    ehlo = await plain.cmd("EHLO client.test")
    assert "STARTTLS" not in ehlo and "AUTH" not in ehlo
    await plain.close()

    chat, greeting = await open_chat(sub_port, local="127.0.0.2")
    try:
        assert greeting.startswith("220 ")
        assert "250-STARTTLS" in await chat.cmd("EHLO client.test")
        assert (await chat.cmd("MAIL FROM:<s@src.test>")).startswith("530 5.7.0")
        second, refused = await open_chat(sub_port)
        assert refused.startswith("421 4.3.2"), refused
        await second.close()
        await starttls(chat, client_context(ca))
        assert peer_der(chat) == file_der(cert)
        assert "AUTH PLAIN LOGIN" in await chat.cmd("EHLO client.test")
        assert (await chat.cmd("AUTH PLAIN " + _b64(f"\0alice\0{PASSWORD}"))).startswith("235")
        assert (await chat.cmd("MAIL FROM:<s@src.test>")).startswith("250")
        assert (await chat.cmd("RCPT TO:<r@elsewhere.test>")).startswith("250")
        assert (await chat.cmd("DATA")).startswith("354")
        reply = await chat.cmd("Subject: t\r\n\r\nhello\r\n.")
        assert reply.startswith("250 2.0.0 Ok: queued as "), reply
    finally:
        await chat.close()


async def test_reload_renews_the_certificate_and_refuses_a_bad_one(
    tmp_path: Path, ca: trustme.CA, started: list[Daemon]
) -> None:
    """After the certificate files are replaced, reload makes new sessions present the new
    certificate; a key that does not match is refused at reload (the last good one stays)."""
    cert, key = write_cert(ca, tmp_path)
    conf = write_config(tmp_path, "smtpd_tls_security_level = may\n" + tls_main(cert, key))
    daemon = await start(conf, started)
    assert daemon.listener is not None
    port = daemon.listener.addresses[0][1]

    async def presented() -> bytes:
        chat, _ = await open_chat(port)
        try:
            await chat.cmd("EHLO client.test")
            await starttls(chat, client_context(ca))
            return peer_der(chat)
        finally:
            await chat.close()

    first = await presented()
    assert first == file_der(cert)
    (tmp_path / "two").mkdir()
    new_cert, new_key = write_cert(ca, tmp_path / "two")
    cert.write_bytes(new_cert.read_bytes())
    key.write_bytes(new_key.read_bytes())
    assert daemon.reload() is True
    second = await presented()
    assert second == file_der(new_cert) and second != first

    (tmp_path / "three").mkdir()
    _, other_key = write_cert(ca, tmp_path / "three")
    key.write_bytes(other_key.read_bytes())  # no longer matches the certificate
    with watch_logs() as logs:
        assert daemon.reload() is False
    refused = [str(e["event"]) for e in logs if "reload refused" in str(e["event"])]
    assert refused and "smtpd_tls_key_file" in refused[0], refused
    assert await presented() == second


@pytest.mark.parametrize(
    ("problem", "param"),
    [
        ("missing cert", "smtpd_tls_cert_file"),
        ("missing key", "smtpd_tls_key_file"),
        ("wrong key", "smtpd_tls_key_file"),
        ("no cert", "smtpd_tls_security_level"),
        ("bad protocols", "smtpd_tls_mandatory_protocols"),
    ],
)
def test_certificate_problems_are_config_errors_naming_the_parameter(
    tmp_path: Path, ca: trustme.CA, problem: str, param: str
) -> None:
    """A missing or unreadable certificate or key, a key that does not match, TLS without a
    certificate or an impossible protocol list: ConfigError naming file, line and parameter."""
    cert, key = write_cert(ca, tmp_path)
    (tmp_path / "x").mkdir()
    _, other_key = write_cert(ca, tmp_path / "x")
    lines = {
        "missing cert": tls_main(tmp_path / "nope.crt", key),
        "missing key": tls_main(cert, tmp_path / "nope.key"),
        "wrong key": tls_main(cert, other_key),
        "no cert": "",
        "bad protocols": tls_main(cert, key)
        + "smtpd_tls_mandatory_protocols = !TLSv1.2 !TLSv1.3 !TLSv1 !TLSv1.1\n",
    }[problem]
    level = "encrypt"
    conf = write_config(tmp_path, f"smtpd_tls_security_level = {level}\n{lines}")
    cfg = load_config(conf, hostname="mx.test")
    with pytest.raises(ConfigError) as info:
        listener_settings(cfg)
    text = str(info.value)
    assert param in text and "main.cf, line" in text, text


def test_bad_inet_lines_are_config_errors_naming_the_line(tmp_path: Path) -> None:
    """An unknown service name or a command other than smtpd on an inet line is refused
    at load, naming master.cf's line."""
    for line, needle in [
        ("nosuchservice inet n - n - - smtpd\n", "unknown service"),
        ("2525 inet n - n - - postscreen\n", "must run smtpd"),
    ]:
        conf = write_config(tmp_path, master=line)
        with pytest.raises(ConfigError, match=needle) as info:
            load_config(conf, hostname="mx.test")
        assert "master.cf, line" in str(info.value)


def test_smtp_inet_line_is_the_main_listener(tmp_path: Path) -> None:
    """``smtp inet ... smtpd`` configures the smtpd_listen listener (its -o settings and a
    numeric maxproc) instead of binding port 25 a second time; submission binds 587 on the
    hosts of smtpd_listen."""
    conf = write_config(
        tmp_path,
        master="smtp inet n - n - 7 smtpd -o smtpd_banner=hello\nsubmission inet n - n - - smtpd\n",
    )
    main, sub = listener_settings(load_config(conf, hostname="mx.test"))
    assert main.listen == (("127.0.0.1", 0),) and main.session_limit == 7
    assert main.smtpd_banner == "hello"
    assert sub.listen == (("127.0.0.1", 587),) and sub.service == "submission"
    assert sub.session_limit == 100 and sub.smtpd_banner != "hello"  # default_process_limit


async def test_start_refuses_a_missing_certificate(tmp_path: Path) -> None:
    """Daemon.start raises the ConfigError (and leaves nothing listening) when the
    certificate file is missing."""
    conf = write_config(
        tmp_path,
        "smtpd_tls_security_level = may\n" + tls_main(tmp_path / "a.crt", tmp_path / "a.key"),
    )
    daemon = Daemon(load_config(conf, hostname="mx.test"), clock=FakeClock(), fsync=False)
    with pytest.raises(ConfigError, match="smtpd_tls_cert_file"):
        await asyncio.wait_for(daemon.start(), TIMEOUT)
    assert daemon.listener is None


async def test_wrappermode_service_from_master_cf(
    tmp_path: Path, ca: trustme.CA, started: list[Daemon]
) -> None:
    """An smtps-style line with -o smtpd_tls_wrappermode=yes greets over TLS."""
    cert, key = write_cert(ca, tmp_path)
    conf = write_config(
        tmp_path,
        tls_main(cert, key),
        master="127.0.0.1:0 inet n - n - - smtpd -o smtpd_tls_wrappermode=yes\n",
    )
    daemon = await start(conf, started)
    port = daemon.services["127.0.0.1:0"].addresses[0][1]
    chat, greeting = await open_chat(port, ctx=client_context(ca))
    try:
        assert greeting.startswith("220 mx.test")
        assert peer_der(chat) == file_der(cert)
        assert isinstance(chat.writer.get_extra_info("ssl_object"), ssl.SSLObject)
    finally:
        await chat.close()


def listening_port(proc: DaemonProcess, service: str) -> int:
    """The port of ``service`` from the daemon's ``listening`` log line."""
    for line in proc.lines:
        if "listening" in line and f"service={service}," in line:
            found = re.search(r"addresses=127\.0\.0\.1:(\d+)", line)
            assert found, line
            return int(found.group(1))
    raise AssertionError(f"no listening line for {service}: {proc.lines}")


async def test_qmgrd_run_renews_the_certificate_at_sighup(tmp_path: Path, ca: trustme.CA) -> None:
    """``qmgrd run`` (its own event loop) serves STARTTLS on the main listener and wrapper
    mode on a master.cf service; after the files are replaced, SIGHUP makes both present
    the new certificate."""
    cert, key = write_cert(ca, tmp_path)
    conf = write_config(
        tmp_path,
        "smtpd_tls_security_level = may\n" + tls_main(cert, key),
        master="127.0.0.1:0 inet n - n - - smtpd -o smtpd_tls_wrappermode=yes\n",
    )
    with running_daemon_process(conf) as proc:
        await proc.wait_line("service=127.0.0.1:0,")  # the output is read by a thread
        main_port = listening_port(proc, "smtp")
        smtps_port = listening_port(proc, "127.0.0.1:0")

        async def presented() -> tuple[bytes, bytes]:
            chat, _ = await open_chat(main_port)
            try:
                await chat.cmd("EHLO client.test")
                await starttls(chat, client_context(ca))
                via_starttls = peer_der(chat)
                assert (await chat.cmd("EHLO client.test")).startswith("250")
            finally:
                await chat.close()
            wrapped, greeting = await open_chat(smtps_port, ctx=client_context(ca))
            try:
                assert greeting.startswith("220 ")
                return via_starttls, peer_der(wrapped)
            finally:
                await wrapped.close()

        assert await presented() == (file_der(cert), file_der(cert))
        (tmp_path / "new").mkdir()
        new_cert, new_key = write_cert(ca, tmp_path / "new")
        cert.write_bytes(new_cert.read_bytes())
        key.write_bytes(new_key.read_bytes())
        proc.send_signal(signal.SIGHUP)
        await asyncio.to_thread(proc.wait_notify, "READY=1")
        assert await presented() == (file_der(new_cert), file_der(new_cert))


def test_unknown_tls_level_is_refused_at_load(tmp_path: Path) -> None:
    """``smtpd_tls_security_level = verify`` (a client-only level) is a ConfigError naming
    main.cf's line and the parameter."""
    conf = write_config(tmp_path, "smtpd_tls_security_level = verify\n")
    with pytest.raises(ConfigError, match=r"main\.cf, line .*smtpd_tls_security_level"):
        load_config(conf, hostname="mx.test")


async def test_chain_files_replace_cert_and_key(
    tmp_path: Path, ca: trustme.CA, started: list[Daemon]
) -> None:
    """``smtpd_tls_chain_files`` (a key, then its certificate chain, in one file) is what
    STARTTLS presents; a chain file without a key is refused naming the parameter."""
    leaf = ca.issue_cert("127.0.0.1")
    chain = tmp_path / "chain.pem"
    leaf.private_key_and_cert_chain_pem.write_to_path(str(chain))
    conf = write_config(
        tmp_path, f"smtpd_tls_security_level = may\nsmtpd_tls_chain_files = {chain}\n"
    )
    daemon = await start(conf, started)
    assert daemon.listener is not None
    chat, _ = await open_chat(daemon.listener.addresses[0][1])
    try:
        await chat.cmd("EHLO client.test")
        await starttls(chat, client_context(ca))
        assert peer_der(chat) == ssl.PEM_cert_to_DER_cert(leaf.cert_chain_pems[0].bytes().decode())
    finally:
        await chat.close()
    certs_only = tmp_path / "certs.pem"
    certs_only.write_bytes(leaf.cert_chain_pems[0].bytes())
    (tmp_path / "etc" / "main.cf").write_text(
        (tmp_path / "etc" / "main.cf").read_text().replace(str(chain), str(certs_only))
    )
    with pytest.raises(ConfigError, match="smtpd_tls_chain_files"):
        listener_settings(load_config(tmp_path / "etc", hostname="mx.test"))
