"""Honest configuration: declared parameters are read; other Postfix ones are refused or warned."""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

import pytest

from qmgrd.config import load_config
from qmgrd.config.params import PARAMS, PER_TRANSPORT
from qmgrd.config.postfix import POSTFIX_NAMES, Kind, classify, fatal_names
from qmgrd.errors import ConfigError

PACKAGE = Path(__file__).resolve().parents[3] / "qmgrd"
# The table itself and the list of Postfix's names mention every name without reading it.
NOT_READERS = {PACKAGE / "config" / "params.py", PACKAGE / "config" / "postfix.py"}

# Parameters other engineers are implementing in parallel (listener, SMTP delivery, DSN): they
# stay declared while their code lands. THE LEAD EMPTIES THIS SET AT MERGE; the test below then
# proves each of them is read somewhere.
IN_PROGRESS_ELSEWHERE: frozenset[str] = frozenset()

MASTER = "smtp unix - - n - - smtp\n"


@functools.cache
def _code_strings() -> frozenset[str]:
    """Every string constant in the package's code, docstrings excluded (parsed once)."""
    found: set[str] = set()
    for path in PACKAGE.rglob("*.py"):
        if path in NOT_READERS:
            continue
        tree = ast.parse(path.read_text(), str(path))
        docstrings = {
            id(node.body[0].value)
            for node in ast.walk(tree)
            if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
            and node.body
            and isinstance(node.body[0], ast.Expr)
            and isinstance(node.body[0].value, ast.Constant)
        }
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Constant)
                and isinstance(node.value, str)
                and id(node) not in docstrings
            ):
                found.add(node.value)
    return frozenset(found)


def _unread_parameters() -> set[str]:
    strings = _code_strings()
    clamps = {p.at_most for p in PARAMS.values() if p.at_most}  # read by Config.get_time
    # a parameter named in another one's default ($fallback_relay) is read through it
    expanded = {ref for p in PARAMS.values() for ref in re.findall(r"\$\{?(\w+)", str(p.default))}
    unread = set()
    for name, param in PARAMS.items():
        names = {name}
        if param.per_transport:
            names.add(param.suffix)  # read through a transport view
        # local_destination_*: a transport-specific default, read through the view's suffix
        names |= {s for s in PER_TRANSPORT if name.endswith("_" + s)}
        if not names & strings and name not in clamps | expanded:
            unread.add(name)
    return unread


def test_every_declared_parameter_is_read_somewhere() -> None:
    """A parameter in the table is looked up by name somewhere in the package."""
    unread = _unread_parameters() - IN_PROGRESS_ELSEWHERE
    assert not unread, f"declared but read nowhere (implement or remove from params.py): {unread}"


def test_in_progress_allowlist_is_still_needed() -> None:
    """Every allowlisted name is still unread; once its code lands, drop it from the allowlist."""
    done = {name for name in IN_PROGRESS_ELSEWHERE if name in PARAMS} - _unread_parameters()
    assert not done, f"read now, remove from IN_PROGRESS_ELSEWHERE: {done}"


def test_scanner_would_catch_an_unread_parameter() -> None:
    """The scan sees declared-only names: relocated_maps is not read by any code."""
    assert "relocated_maps" not in _code_strings()
    assert "queue_directory" in _code_strings()


def _load(tmp_path: Path, main: str, master: str = MASTER) -> None:
    (tmp_path / "main.cf").write_text(main)
    (tmp_path / "master.cf").write_text(master)
    load_config(tmp_path, hostname="h.example")


@pytest.mark.parametrize(
    ("setting", "what"),
    [
        ("body_checks = regexp:/etc/postfix/body_checks", "does not inspect"),
        ("recipient_bcc_maps = hash:/etc/postfix/bcc", "never adds recipients"),
        ("remote_header_rewrite_domain = example.com", "never rewrites addresses"),
        ("smtp_tls_per_site = hash:/x", "would not apply"),
        ("smtp_sasl_type = dovecot", "own SASL code"),
        ("smtp_sasl_path = private/auth", "own SASL code"),
        ("inet_interfaces = all", "set smtpd_listen instead"),
        ("smtp_bind_address_enforce = yes", "no enforcement mode"),
        ("relay_domains = example.com", "routes only with transport_maps"),
        ("mydestination = $myhostname, localhost.example", "routes only with transport_maps"),
        ("virtual_alias_maps = hash:/x", "never rewrites addresses"),
        ("smtpd_recipient_restrictions = reject_unknown_sender_domain", "no access restrictions"),
        ("smtpd_milters = inet:127.0.0.1:8891", "does not inspect"),
        ("content_filter = amavis:[127.0.0.1]:10024", "does not inspect"),
        ("smtpd_tls_req_ccert = yes", "no client certificates"),
        ("always_bcc = archive@example.com", "never adds recipients"),
    ],
)
def test_postfix_parameter_changing_routing_content_or_security_is_fatal(
    tmp_path: Path, setting: str, what: str
) -> None:
    """Such a Postfix parameter stops the load, naming file, line, parameter and what to do."""
    name = setting.split(" =")[0]
    with pytest.raises(ConfigError) as info:
        _load(tmp_path, f"# a comment\nmyhostname = h.example\n{setting}\n")
    message = str(info.value)
    assert message.startswith(f"{tmp_path / 'main.cf'}, line 3: parameter {name}: ")
    assert what in message
    assert "remove it" in message or "set smtpd_listen" in message


def test_fatal_in_master_cf_override_names_master_cf(tmp_path: Path) -> None:
    """A refused parameter given with -o in master.cf is reported at its master.cf line."""
    with pytest.raises(ConfigError, match=r"master\.cf, line 2: parameter smtp_body_checks"):
        _load(tmp_path, "", MASTER + "relay unix - - n - - smtp -o smtp_body_checks=pcre:/x\n")


def test_several_fatal_parameters_are_counted(tmp_path: Path) -> None:
    """The first refusal is reported and the number of the others is given."""
    with pytest.raises(ConfigError, match=r"line 1: parameter body_checks: .*\(and 1 more"):
        _load(tmp_path, "body_checks = regexp:/a\nmilter_header_checks = regexp:/b\n")


@pytest.mark.parametrize(
    "setting",
    [
        "body_checks =",  # empty: the feature is off, as in qmgrd
        "alias_maps = hash:/etc/aliases, nis:mail.aliases",  # Postfix's default
        "smtp_sasl_type = cyrus",  # Postfix's default
        "inet_interfaces = loopback-only",
        "inet_protocols = all",
        "smtpd_relay_restrictions = permit_mynetworks permit_sasl_authenticated "
        "defer_unauth_destination",
    ],
)
def test_harmless_values_of_fatal_parameters_only_warn(tmp_path: Path, setting: str) -> None:
    """An empty value or Postfix's default asks for what qmgrd does: a warning, not an error."""
    (tmp_path / "main.cf").write_text(f"{setting}\n")
    (tmp_path / "master.cf").write_text(MASTER)
    cfg = load_config(tmp_path, hostname="h.example")
    name = setting.split(" =")[0]
    assert any(f"ignoring Postfix parameter {name}" in w for w in cfg.warnings)


@pytest.mark.parametrize(
    "setting",
    [
        "compatibility_level = 3.6",
        "biff = no",
        "mailbox_size_limit = 0",
        "readme_directory = no",
        "berkeley_db_read_buffer_size = 131072",
        "notify_classes = resource, software, bounce",
        "qmgr_clog_warn_time = 300s",
    ],
)
def test_harmless_postfix_parameters_warn(tmp_path: Path, setting: str) -> None:
    """Performance hints and settings a relay never uses give a warning naming file and line."""
    (tmp_path / "main.cf").write_text(f"{setting}\n")
    (tmp_path / "master.cf").write_text(MASTER)
    cfg = load_config(tmp_path, hostname="h.example")
    name = setting.split(" =")[0]
    assert cfg.warnings == (
        f"{tmp_path / 'main.cf'}, line 1: ignoring Postfix parameter {name} "
        "(qmgrd does not implement it; harmless for a relay)",
    )


def test_non_strict_load_lists_refusals(tmp_path: Path) -> None:
    """strict=False (postconf, operator tools) loads the configuration and lists refusals."""
    (tmp_path / "main.cf").write_text("body_checks = regexp:/x\n")
    (tmp_path / "master.cf").write_text(MASTER)
    cfg = load_config(tmp_path, hostname="h.example", strict=False)
    assert len(cfg.refused) == 1 and "parameter body_checks" in cfg.refused[0]


def test_declared_parameters_are_never_refused(tmp_path: Path) -> None:
    """Names in qmgrd's table are never judged as Postfix leftovers, whatever their value."""
    main = "smtp_tls_security_level = encrypt\nrelayhost = [relay.example]:587\n"
    (tmp_path / "main.cf").write_text(main)
    (tmp_path / "master.cf").write_text(MASTER)
    cfg = load_config(tmp_path, hostname="h.example")
    assert (cfg.warnings, cfg.refused) == ((), ())


def test_classification_covers_only_postfix_names() -> None:
    """Every refusable name is a real Postfix 3.7 parameter; user-defined names are not judged."""
    assert {name for name, _ in fatal_names()} <= POSTFIX_NAMES
    assert classify("my_own_setting", "x") is None
    verdict = classify("biff", "yes")
    assert verdict is not None and verdict.kind is Kind.HARMLESS


def test_connection_cache_ttl_limit_clamps_the_cache_time(tmp_path: Path) -> None:
    """connection_cache_ttl_limit caps smtp_connection_cache_time_limit (Postfix's scache)."""
    (tmp_path / "main.cf").write_text(
        "smtp_connection_cache_time_limit = 30s\nconnection_cache_ttl_limit = 5s\n"
    )
    (tmp_path / "master.cf").write_text(MASTER)
    cfg = load_config(tmp_path, hostname="h.example")
    assert cfg.get_time("smtp_connection_cache_time_limit") == 5
    assert cfg.transport("smtp").get_time("smtp_connection_cache_time_limit") == 5
