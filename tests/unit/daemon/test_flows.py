"""Flows from envelopes: each key kind, per-transport overrides, the weight table and its errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from qmgrd.config import load_config
from qmgrd.core.flow import FLOW_NONE, Flow
from qmgrd.daemon.flows import (
    FairnessSettings,
    fairness_settings,
    flow_of,
    parse_weight,
    transport_flows,
)
from qmgrd.errors import ConfigError
from qmgrd.spool import Envelope, RecipientSpec
from qmgrd.tables import postmap

MASTER = """\
smtp      unix  -       -       n       -       -       smtp
relay     unix  -       -       n       -       -       smtp
"""

ENV = Envelope(
    "Alice@Example.ORG",
    (RecipientSpec("r@x.test"),),
    1.0,
    client_addr="192.0.2.7",
    sasl_username="alice",
)
NULL = Envelope("", (RecipientSpec("r@x.test"),), 1.0)


@pytest.fixture(autouse=True)
def recheck_every_lookup(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tables look at their files at every lookup here (normally at most once a second)."""
    monkeypatch.setattr("qmgrd.tables.base.RECHECK_INTERVAL", 0.0)


def settings(tmp_path: Path, main: str, master: str = MASTER) -> FairnessSettings:
    (tmp_path / "main.cf").write_text(main)
    (tmp_path / "master.cf").write_text(master)
    return fairness_settings(load_config(tmp_path, hostname="h.example"))


@pytest.mark.parametrize(
    ("kind", "key", "null_key"),
    [
        ("sender_domain", "sender_domain:example.org", "sender_domain:<>"),
        ("sender", "sender:alice@example.org", "sender:<>"),
        ("sasl_username", "sasl_username:alice", "sasl_username:<unauthenticated>"),
        ("client_address", "client_address:192.0.2.7", "client_address:<local>"),
    ],
)
def test_each_key_kind_takes_its_envelope_field(
    tmp_path: Path, kind: str, key: str, null_key: str
) -> None:
    """Each key kind builds ``kind:value`` from its field; a missing field has its own flow."""
    fs = settings(tmp_path, f"default_fairness_key = {kind}\n")
    assert fs.enabled
    assert flow_of(ENV, fs) == Flow(key)
    assert flow_of(NULL, fs) == Flow(null_key)


def test_none_is_the_default_and_gives_flow_none(tmp_path: Path) -> None:
    """Without settings every message is FLOW_NONE (Postfix's schedules)."""
    fs = settings(tmp_path, "")
    assert fs.default_key == "none" and not fs.enabled
    assert flow_of(ENV, fs) is FLOW_NONE
    assert flow_of(ENV, fs, "smtp") is FLOW_NONE
    assert transport_flows(ENV, fs) == {}


def test_per_transport_override_in_main_cf_and_master_cf(tmp_path: Path) -> None:
    """``relay_fairness_key`` (main.cf) and ``-o smtp_fairness_key`` (master.cf) override the
    default for their transport only; admission (transport None) uses the default."""
    master = MASTER.replace(
        "smtp      unix  -       -       n       -       -       smtp",
        "smtp      unix  -       -       n       -       -       smtp\n"
        "  -o smtp_fairness_key=client_address",
    )
    fs = settings(tmp_path, "default_fairness_key = sender\nrelay_fairness_key = none\n", master)
    assert flow_of(ENV, fs) == Flow("sender:alice@example.org")
    assert flow_of(ENV, fs, "smtp") == Flow("client_address:192.0.2.7")
    assert flow_of(ENV, fs, "relay") is FLOW_NONE
    assert flow_of(ENV, fs, "discard") == Flow("sender:alice@example.org")
    assert transport_flows(ENV, fs) == {
        "smtp": Flow("client_address:192.0.2.7"),
        "relay": FLOW_NONE,
    }


def test_unknown_key_kind_is_a_config_error(tmp_path: Path) -> None:
    """A key kind outside the list is refused when the configuration is loaded."""
    with pytest.raises(ConfigError, match="default_fairness_key"):
        settings(tmp_path, "default_fairness_key = recipient\n")


def test_weight_table_gives_weights_and_tenants(tmp_path: Path) -> None:
    """Keys are looked up whole, then bare; a tenant groups keys into one flow; keys the table
    does not list keep weight 1."""
    (tmp_path / "weights").write_text(
        "# weights\n"
        "sender_domain:example.org  2\n"
        "big.test                   0.5   bulk\n"
        "other.test                 0.5   bulk\n"
    )
    fs = settings(
        tmp_path, "default_fairness_key = sender_domain\nfairness_weight_maps = texthash:weights\n"
    )
    assert flow_of(ENV, fs) == Flow("sender_domain:example.org", 2.0)
    big = flow_of(Envelope("a@big.test", ENV.recipients, 1.0), fs)
    other = flow_of(Envelope("b@OTHER.test", ENV.recipients, 1.0), fs)
    assert big == other == Flow("tenant:bulk", 0.5, "bulk")
    assert big.label == "bulk"
    assert flow_of(Envelope("c@free.test", ENV.recipients, 1.0), fs) == Flow(
        "sender_domain:free.test"
    )


def test_weight_table_by_cidr_for_client_addresses(tmp_path: Path) -> None:
    """A cidr table matches client addresses (the bare value of client_address keys)."""
    fs = settings(
        tmp_path,
        "default_fairness_key = client_address\n"
        "fairness_weight_maps = cidr:{ { 192.0.2.0/24 3 lan } }\n",
    )
    assert flow_of(ENV, fs) == Flow("tenant:lan", 3.0, "lan")


def test_hash_table_values_are_checked_in_the_source(tmp_path: Path) -> None:
    """An indexed (hash) table's source file is checked too: the error names its line."""
    (tmp_path / "w").write_text("a.test 2\nb.test two\n")
    postmap(tmp_path / "w")
    with pytest.raises(ConfigError) as info:
        settings(tmp_path, "fairness_weight_maps = hash:w\n")
    assert f"{tmp_path / 'w'}, line 2: weight 'two' is not a number" in str(info.value)


@pytest.mark.parametrize(
    ("value", "needle"),
    [
        ("x", "weight 'x' is not a number"),
        ("0", "weight '0' is not in (0, 1000]"),
        ("-1", "weight '-1' is not in"),
        ("nan", "weight 'nan' is not in"),
        ("1e9", "weight '1e9' is not in"),
        ("2 bad/name", "tenant 'bad/name' is not a name"),
        ("2 t extra", "expected 'WEIGHT [TENANT]'"),
    ],
)
def test_bad_weight_is_a_config_error_naming_file_line_and_parameter(
    tmp_path: Path, value: str, needle: str
) -> None:
    """A bad value stops the load with main.cf's line, the parameter, the file and its line."""
    (tmp_path / "weights").write_text(f"good.test 1\n\nbad.test {value}\n")
    with pytest.raises(ConfigError) as info:
        settings(tmp_path, "# fairness\nfairness_weight_maps = texthash:weights\n")
    text = str(info.value)
    assert text.startswith(
        f"{tmp_path / 'main.cf'}, line 2: parameter fairness_weight_maps: "
        f"{tmp_path / 'weights'}, line 3: "
    ), text
    assert needle in text


def test_bad_inline_value_names_the_element(tmp_path: Path) -> None:
    """An inline table's bad value names the parameter and the element."""
    with pytest.raises(ConfigError, match=r"parameter fairness_weight_maps: .*element 2: weight"):
        settings(tmp_path, "fairness_weight_maps = inline:{ a.test=1, b.test=zero }\n")


def test_bad_pattern_table_value_is_logged_and_weight_1_used(tmp_path: Path) -> None:
    """A regexp table's value is checked when it matches: logged once, weight 1, no crash."""
    (tmp_path / "main.cf").write_text(
        "default_fairness_key = sender\nfairness_weight_maps = regexp:{ {/alice/ heavy} }\n"
    )
    (tmp_path / "master.cf").write_text(MASTER)
    warnings: list[str] = []
    fs = fairness_settings(load_config(tmp_path, hostname="h.example"), warnings.append)
    assert flow_of(ENV, fs) == Flow("sender:alice@example.org")
    assert flow_of(ENV, fs) == Flow("sender:alice@example.org")
    assert len(warnings) == 1 and "weight 'heavy' is not a number" in warnings[0]


def test_parse_weight_accepts_fractions_and_tenants() -> None:
    """``WEIGHT [TENANT]``: a positive number, optionally a tenant name."""
    assert parse_weight("2") == (2.0, "")
    assert parse_weight(" 0.25  team-a.x ") == (0.25, "team-a.x")
