"""bounce_size_limit: from main.cf to the engine settings to the attached original."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from qmgrd.config import load_config
from qmgrd.daemon.settings import engine_settings
from qmgrd.delivery.dsn import DsnRecipient, compose_dsn
from qmgrd.errors import ConfigError

REPO = Path(__file__).resolve().parents[3]
ORIGINAL = b"Subject: x\r\n\r\n" + b"y" * 200 + b"\r\n"


def _conf(tmp_path: Path, main_cf: str) -> Path:
    conf = tmp_path / "etc"
    conf.mkdir(exist_ok=True)
    (conf / "master.cf").write_text((REPO / "config" / "master.cf").read_text())
    (conf / "main.cf").write_text(main_cf)
    return conf


def _attached_type(limit: int) -> bytes:
    raw = compose_dsn(
        reporting_mta="mx.test",
        queue_id="Q1",
        original_sender="a@example.org",
        arrival_time=datetime(2024, 5, 1, tzinfo=UTC),
        recipients=[DsnRecipient("b@example.com", "failed", "5.1.1")],
        original_headers=ORIGINAL,
        original_message=ORIGINAL,
        bounce_size_limit=limit,
    )
    return raw.rpartition(b"Content-Type: ")[2].partition(b"\r\n")[0]


def test_default_is_postfix_50000(tmp_path: Path) -> None:
    """Without a setting the engine gets Postfix's 50000 and a small original is returned whole."""
    limit = engine_settings(load_config(_conf(tmp_path, ""), hostname="mx.test")).bounce_size_limit
    assert limit == 50000
    assert _attached_type(limit) == b"message/rfc822"


def test_main_cf_value_reaches_the_notice(tmp_path: Path) -> None:
    """bounce_size_limit = 100 in main.cf makes a 216-byte original come back as headers only."""
    cfg = load_config(_conf(tmp_path, "bounce_size_limit = 100\n"), hostname="mx.test")
    limit = engine_settings(cfg).bounce_size_limit
    assert limit == 100
    assert _attached_type(limit) == b"text/rfc822-headers"


def test_zero_is_refused_naming_the_parameter(tmp_path: Path) -> None:
    """A limit below 1 byte is a configuration error that names the parameter (Postfix: >= 1)."""
    with pytest.raises(ConfigError, match="bounce_size_limit"):
        load_config(_conf(tmp_path, "bounce_size_limit = 0\n"), hostname="mx.test")
