"""systemd unit, tmpfiles.d and sysusers.d snippets: content checks and systemd's own tools."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

SYSTEMD = Path(__file__).resolve().parents[2] / "systemd"
UNIT = SYSTEMD / "qmgrd.service"


def _directives(path: Path) -> dict[str, dict[str, list[str]]]:
    """The unit's [Section] Key=value assignments (repeated keys kept in order)."""
    sections: dict[str, dict[str, list[str]]] = {}
    current: dict[str, list[str]] | None = None
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        header = re.fullmatch(r"\[(\w+)\]", line)
        if header:
            current = sections.setdefault(header.group(1), {})
            continue
        assert current is not None, f"assignment outside a section: {line}"
        key, sep, value = line.partition("=")
        assert sep, f"not an assignment: {line}"
        current.setdefault(key, []).append(value)
    return sections


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.skip(f"{name} is not installed (systemd tools are optional in CI)")
    return path


def test_service_directives_the_issue_requires() -> None:
    """Type=notify, reload by HUP, restart on failure, a dedicated user, spool and config paths."""
    service = _directives(UNIT)["Service"]
    expected = {
        "Type": ["notify"],
        "NotifyAccess": ["main"],
        "ExecStartPre": ["/opt/qmgrd/bin/qmgrd -c /etc/qmgrd check"],
        "ExecStart": ["/opt/qmgrd/bin/qmgrd -c /etc/qmgrd run"],
        "ExecReload": ["/bin/kill -HUP $MAINPID"],
        "Restart": ["on-failure"],
        "User": ["qmgrd"],
        "Group": ["qmgrd"],
        "ConfigurationDirectory": ["qmgrd"],
        "ReadWritePaths": ["/var/spool/qmgrd"],
        "NoNewPrivileges": ["yes"],
        "ProtectSystem": ["strict"],
        "ProtectHome": ["yes"],
        "PrivateTmp": ["yes"],
        "PrivateDevices": ["yes"],
        "RestrictAddressFamilies": ["AF_INET AF_INET6 AF_UNIX"],
        "AmbientCapabilities": ["CAP_NET_BIND_SERVICE"],
        "CapabilityBoundingSet": ["CAP_NET_BIND_SERVICE"],
    }
    for key, value in expected.items():
        assert service.get(key) == value, key
    assert "StateDirectory" not in service  # /var/lib, not the spool under /var/spool


def test_stop_timeout_exceeds_shutdown_timeout() -> None:
    """TimeoutStopSec leaves room for shutdown_timeout (default 30s) plus closing."""
    service = _directives(UNIT)["Service"]
    (value,) = service["TimeoutStopSec"]
    seconds = int(value.removesuffix("s"))
    assert seconds > 30


def test_tmpfiles_creates_a_private_spool() -> None:
    """The tmpfiles.d line creates /var/spool/qmgrd mode 0700 owned by qmgrd."""
    lines = [
        line.split()
        for line in (SYSTEMD / "qmgrd.tmpfiles").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert lines == [["d", "/var/spool/qmgrd", "0700", "qmgrd", "qmgrd", "-"]]


def test_systemd_analyze_verify(tmp_path: Path) -> None:
    """systemd-analyze verify accepts the unit (ExecStart pointed at an existing binary)."""
    tool = _tool("systemd-analyze")
    # verify checks that ExecStart exists; qmgrd is not installed in /opt/qmgrd here.
    text = UNIT.read_text().replace("/opt/qmgrd/bin/qmgrd", shutil.which("true") or "/bin/true")
    unit = tmp_path / "qmgrd.service"
    unit.write_text(text)
    proc = subprocess.run(
        [tool, "verify", "--man=no", str(unit)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert "qmgrd.service" not in proc.stderr, proc.stderr  # no warnings about our unit


def test_systemd_analyze_security_exposure(tmp_path: Path) -> None:
    """The hardening keeps systemd's exposure score at or below 2.0 ("OK")."""
    tool = _tool("systemd-analyze")
    unit = tmp_path / "qmgrd.service"
    unit.write_text(UNIT.read_text().replace("/opt/qmgrd/bin/qmgrd", "/bin/true"))
    proc = subprocess.run(
        [tool, "security", "--offline=yes", "--threshold=20", "--no-pager", str(unit)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if "--offline" in proc.stderr or "unrecognized option" in proc.stderr:
        pytest.skip("systemd-analyze is older than v250 (no security --offline)")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr


def test_sysusers_creates_the_user(tmp_path: Path) -> None:
    """systemd-sysusers, run against an empty root, creates a qmgrd system user and group."""
    tool = _tool("systemd-sysusers")
    (tmp_path / "etc").mkdir()
    subprocess.run(
        [tool, f"--root={tmp_path}", str(SYSTEMD / "qmgrd.sysusers")],
        capture_output=True,
        timeout=60,
        check=True,
    )
    passwd = (tmp_path / "etc" / "passwd").read_text().splitlines()
    (entry,) = [line for line in passwd if line.startswith("qmgrd:")]
    _name, _pw, uid, gid, _gecos, home, shell = entry.split(":")
    assert int(uid) < 1000  # a system user
    assert home == "/var/spool/qmgrd"
    assert shell.endswith("nologin")
    group = (tmp_path / "etc" / "group").read_text()
    assert f"qmgrd:x:{gid}:" in group


def test_tmpfiles_creates_the_spool(tmp_path: Path) -> None:
    """systemd-tmpfiles, run against a root holding the qmgrd user, makes the spool 0700."""
    if os.geteuid() != 0:
        pytest.skip("systemd-tmpfiles needs root to chown the spool to qmgrd")
    sysusers = _tool("systemd-sysusers")
    tmpfiles = _tool("systemd-tmpfiles")
    (tmp_path / "etc").mkdir()
    subprocess.run(
        [sysusers, f"--root={tmp_path}", str(SYSTEMD / "qmgrd.sysusers")],
        capture_output=True,
        timeout=60,
        check=True,
    )
    subprocess.run(
        [tmpfiles, f"--root={tmp_path}", "--create", str(SYSTEMD / "qmgrd.tmpfiles")],
        capture_output=True,
        timeout=60,
        check=True,
    )
    spool = tmp_path / "var" / "spool" / "qmgrd"
    assert spool.is_dir()
    assert spool.stat().st_mode & 0o777 == 0o700
    passwd = (tmp_path / "etc" / "passwd").read_text()
    assert f"qmgrd:x:{spool.stat().st_uid}:" in passwd


def test_production_config_matches_the_unit() -> None:
    """config/production puts the spool where the unit may write and listens where it may bind."""
    from qmgrd.config import load_config

    production = SYSTEMD.parent / "config" / "production"
    cfg = load_config(production, hostname="mx1.example.com")
    service = _directives(UNIT)["Service"]
    assert [str(cfg.get_path("queue_directory"))] == service["ReadWritePaths"]
    assert cfg.get_hostports("smtpd_listen") == (("127.0.0.1", 25),)
    assert service["CapabilityBoundingSet"] == ["CAP_NET_BIND_SERVICE"]  # port 25 as qmgrd
    assert cfg.get_str("syslog_name") == "qmgrd"
    assert not cfg.warnings  # nothing in the example is ignored
