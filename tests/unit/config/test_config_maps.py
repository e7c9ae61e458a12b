"""*_maps parameters: tables opened from main.cf, errors that say where, transport routing."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from qmgrd.config import load_config
from qmgrd.config.maps import open_maps
from qmgrd.core.resolve import Resolver
from qmgrd.daemon.settings import resolver_settings
from qmgrd.errors import ConfigError
from qmgrd.tables import postmap


@pytest.fixture(autouse=True)
def recheck_every_lookup(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tables look at their files at every lookup here (normally at most once a second)."""
    monkeypatch.setattr("qmgrd.tables.base.RECHECK_INTERVAL", 0.0)


MASTER = """\
smtp      unix  -       -       n       -       -       smtp
relay     unix  -       -       n       -       -       smtp
"""


def resolver(tmp_path: Path, main: str) -> Resolver:
    (tmp_path / "main.cf").write_text(main)
    (tmp_path / "master.cf").write_text(MASTER)
    return Resolver(resolver_settings(load_config(tmp_path, hostname="h.example")))


def test_transport_maps_hash_table_routes(tmp_path: Path) -> None:
    """transport_maps = hash:FILE routes through the postmap-built index."""
    source = tmp_path / "transport"
    source.write_text("example.com relay:[mx.example.net]:2525\n")
    postmap(source)
    r = resolver(tmp_path, "transport_maps = hash:transport\n")
    got = r.resolve("u@example.com")
    assert (got.transport, got.nexthop) == ("relay", "[mx.example.net]:2525")
    assert r.resolve("u@other.example").transport == "smtp"


def test_transport_maps_regexp_sees_full_address(tmp_path: Path) -> None:
    """A regexp transport map matches the whole address, with $1 substitution."""
    (tmp_path / "t.re").write_text("/@(.+)\\.internal$/ relay:[$1.gw]\n")
    r = resolver(tmp_path, "transport_maps = regexp:t.re\n")
    assert r.resolve("u@corp.internal").nexthop == "[corp.gw]"


def test_parent_domain_matches_subdomains_applies_to_transport_maps(tmp_path: Path) -> None:
    """With transport_maps in parent_domain_matches_subdomains, 'example.com' covers subdomains."""
    main = "transport_maps = inline:{ example.com=relay: }\n"
    assert resolver(tmp_path, main).resolve("u@sub.example.com").transport == "smtp"
    main += "parent_domain_matches_subdomains = transport_maps\n"
    assert resolver(tmp_path, main).resolve("u@sub.example.com").transport == "relay"


def test_changed_texthash_is_seen_without_reload(tmp_path: Path) -> None:
    """Editing a texthash transport table changes routing at the next lookup."""
    path = tmp_path / "transport"
    path.write_text("example.com relay:\n")
    r = resolver(tmp_path, "transport_maps = texthash:transport\n")
    assert r.resolve("u@example.com").transport == "relay"
    old = os.stat(path).st_mtime_ns
    path.write_text("example.com smtp:[other]\n")
    os.utime(path, ns=(old + 2_000_000_000, old + 2_000_000_000))
    assert r.resolve("u@example.com").nexthop == "[other]"


def test_bad_table_error_names_setting_parameter_and_table_line(tmp_path: Path) -> None:
    """A malformed table line is reported with main.cf line, parameter and table line."""
    (tmp_path / "t.re").write_text("/ok/ x\n/bad(/ y\n")
    (tmp_path / "main.cf").write_text("# routing\ntransport_maps = regexp:t.re\n")
    (tmp_path / "master.cf").write_text(MASTER)
    cfg = load_config(tmp_path, hostname="h.example")
    with pytest.raises(ConfigError) as info:
        open_maps(cfg, "transport_maps")
    assert str(info.value).startswith(
        f"{tmp_path / 'main.cf'}, line 2: parameter transport_maps: {tmp_path / 't.re'}, line 2: "
        "bad regular expression /bad(/"
    )


def test_unsupported_table_type_is_refused(tmp_path: Path) -> None:
    """An unknown table type is an error naming the parameter, not a silent no-route."""
    with pytest.raises(ConfigError, match="parameter transport_maps: btree:/x: unsupported"):
        resolver(tmp_path, "transport_maps = btree:/x\n")
