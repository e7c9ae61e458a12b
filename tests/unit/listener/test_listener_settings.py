"""The listener's client-limit parameters: read from main.cf with Postfix's names and defaults."""

from __future__ import annotations

import dataclasses
import ipaddress
import os
import resource
from pathlib import Path

import pytest

from qmgrd.config import load_config
from qmgrd.errors import ConfigError
from qmgrd.listener import ListenerSettings
from qmgrd.listener import settings as settings_module
from qmgrd.listener.limits import ClientCounters
from qmgrd.listener.server import fd_session_cap
from qmgrd.spool.batchsync import DEFAULT_DIRTY_LIMIT, syncfs_reports_errors
from tests.support.listener import listening

SYNCFS_HERE = syncfs_reports_errors(os.uname().sysname, os.uname().release)

REPO = Path(__file__).resolve().parents[3]


def _settings(tmp_path: Path, main_cf: str) -> ListenerSettings:
    conf = tmp_path / "etc"
    conf.mkdir(exist_ok=True)
    (conf / "master.cf").write_text((REPO / "config" / "master.cf").read_text())
    (conf / "main.cf").write_text(main_cf)
    return ListenerSettings.from_config(load_config(conf, hostname="mx.test"))


def test_defaults_are_postfix_defaults(tmp_path: Path) -> None:
    """Defaults: 50 per client, AUTH rate off, 60 s unit, junk 100, hard 20, banner expanded."""
    s = _settings(tmp_path, "")
    assert (s.client_connection_limit, s.auth_rate_limit, s.rate_time_unit) == (50, 0, 60.0)
    assert (s.junk_command_limit, s.hard_error_limit, s.session_limit) == (100, 20, 1000)
    assert s.banner == "mx.test ESMTP qmgrd"
    assert s.limit_exceptions == s.mynetworks  # "$mynetworks"
    assert s.limit_exempt("127.0.0.1") and not s.limit_exempt("192.0.2.1")


def test_values_from_main_cf(tmp_path: Path) -> None:
    """Every client-limit parameter set in main.cf reaches the listener's settings."""
    s = _settings(
        tmp_path,
        "smtpd_banner = $myhostname ready\n"
        "smtpd_session_limit = 7\n"
        "smtpd_client_connection_count_limit = 3\n"
        "smtpd_client_auth_rate_limit = 5\n"
        "smtpd_client_event_limit_exceptions = 192.0.2.0/24\n"
        "anvil_rate_time_unit = 2m\n"
        "smtpd_junk_command_limit = 9\n"
        "smtpd_hard_error_limit = 4\n",
    )
    assert s.banner == "mx.test ready"
    assert (s.session_limit, s.client_connection_limit, s.auth_rate_limit) == (7, 3, 5)
    assert s.limit_exceptions == (ipaddress.ip_network("192.0.2.0/24"),)
    assert (s.rate_time_unit, s.junk_command_limit, s.hard_error_limit) == (120.0, 9, 4)
    assert s.limit_exempt("192.0.2.9") and not s.limit_exempt("127.0.0.1")


def test_bad_values_are_config_errors(tmp_path: Path) -> None:
    """A session limit of 0 or a bad exception network is refused with the parameter's name."""
    with pytest.raises(ConfigError, match="smtpd_session_limit"):
        _settings(tmp_path, "smtpd_session_limit = 0\n")
    with pytest.raises(ConfigError):
        _settings(tmp_path, "smtpd_client_event_limit_exceptions = not-a-net\n")


def test_counters_count_sessions_and_auth_windows() -> None:
    """Sessions per address go up and down; AUTH counts restart when the window has passed."""
    counters = ClientCounters()
    assert counters.connect("a") == 1 and counters.connect("a") == 2 and counters.connect("b") == 1
    counters.disconnect("a")
    assert (counters.sessions("a"), counters.sessions("b"), counters.total) == (1, 1, 2)
    assert [counters.auth_event("a", t, 60) for t in (0, 10, 59.9)] == [1, 2, 3]
    assert counters.auth_event("a", 60, 60) == 1
    assert counters.auth_event("b", 60, 60) == 1


def test_session_cap_fits_the_open_file_limit() -> None:
    """Two descriptors per session and 256 kept: 1024 allows 384 sessions, never fewer than 1."""
    assert fd_session_cap(1024) == 384
    assert fd_session_cap(65536) == 32640
    assert fd_session_cap(100) == 1
    assert fd_session_cap(resource.RLIM_INFINITY) > 1_000_000


def test_network_answers_are_remembered_per_settings_and_bounded() -> None:
    """permits_relay / limit_exempt answer the same when asked again (memo), a replaced
    settings object answers for its own networks, and many addresses stay bounded."""
    s = ListenerSettings(
        listen=(),
        myhostname="mx.test",
        mynetworks=(ipaddress.ip_network("127.0.0.0/8"),),
        message_size_limit=0,
        smtpd_recipient_limit=10,
        smtpd_timeout=300.0,
        limit_exceptions=(ipaddress.ip_network("192.0.2.0/24"),),
    )
    for _ in range(2):
        assert s.permits_relay("127.0.0.1") and not s.permits_relay("192.0.2.1")
        assert s.limit_exempt("192.0.2.1") and not s.limit_exempt("127.0.0.1")
        assert s.permits_relay("::ffff:127.0.0.2") and not s.permits_relay("bad")
    other = dataclasses.replace(s, mynetworks=(ipaddress.ip_network("192.0.2.0/24"),))
    assert other.permits_relay("192.0.2.1") and not other.permits_relay("127.0.0.1")
    assert s.permits_relay("127.0.0.1")
    for i in range(3 * settings_module._MEMO_SIZE):
        assert not s.permits_relay(f"2001:db8::{i:x}")
    assert len(s._relay_memo) <= settings_module._MEMO_SIZE
    assert s.permits_relay("127.0.0.1")


def test_a_replaced_settings_object_builds_its_own_ehlo_lines() -> None:
    """EHLO's lines are kept per settings object: a copy with another SIZE starts empty."""
    s = ListenerSettings(
        listen=(),
        myhostname="mx.test",
        mynetworks=(ipaddress.ip_network("127.0.0.0/8"),),
        message_size_limit=1000,
        smtpd_recipient_limit=10,
        smtpd_timeout=300.0,
    )
    s.ehlo_replies[(False, False)] = (("250 SIZE 1000",), b"250 SIZE 1000\r\n")
    other = dataclasses.replace(s, message_size_limit=2000)
    assert other.ehlo_replies == {}
    assert s.ehlo_replies


@pytest.mark.parametrize(
    ("main_cf", "limit", "syncfs"),
    [
        ("", DEFAULT_DIRTY_LIMIT, None),  # the default: depends on this machine's dirty cache
        ("queue_syncfs_dirty_limit = 0\n", 0, False),
        (f"queue_syncfs_dirty_limit = {1 << 62}\n", 1 << 62, SYNCFS_HERE),
    ],
)
async def test_queue_syncfs_dirty_limit_reaches_the_listeners_group_commit(
    tmp_path: Path, main_cf: str, limit: int, syncfs: bool | None
) -> None:
    """main.cf's queue_syncfs_dirty_limit decides how the listener's commits are made durable:
    0 = an fsync per file (syncfs never), out of reach = one syncfs per batch (where the
    kernel reports syncfs's write errors)."""
    settings = dataclasses.replace(_settings(tmp_path, main_cf), listen=(("127.0.0.1", 0),))
    assert settings.syncfs_dirty_limit == limit
    async with listening(tmp_path, settings, fsync=True) as server:
        chat = await server.chat()
        for line in ("EHLO c.test", "MAIL FROM:<s@c.test>", "RCPT TO:<r@far.test>", "DATA"):
            assert (await chat.cmd(line))[0] in "23"
        assert (await chat.cmd("Subject: s\r\n\r\nbody\r\n.")).startswith("250 ")
        sync = server.handle.committer.batch_sync
        counts = sync.syncfs_batches, sync.fsync_batches
        assert len(server.ids()) == 1
    assert sum(counts) == 1
    if syncfs is not None:
        assert counts == ((1, 0) if syncfs else (0, 1))
