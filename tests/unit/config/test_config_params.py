"""The parameter table: the notes §12 set with Postfix defaults, flags, bounds, docs."""

from __future__ import annotations

import pytest

from qmgrd.config.params import (
    PARAMS,
    PER_TRANSPORT,
    Param,
    ParamType,
    describe,
    find_param,
    split_transport_name,
)

# (name, Postfix 3.x default) for every parameter notes §12 lists; <t>_ ones by default_ name.
NOTES_12 = [
    ("qmgr_message_active_limit", "20000"),
    ("qmgr_message_recipient_limit", "20000"),
    ("qmgr_message_recipient_minimum", "10"),
    ("default_recipient_limit", "20000"),
    ("default_extra_recipient_limit", "1000"),
    ("default_recipient_refill_limit", "100"),
    ("default_recipient_refill_delay", "5s"),
    ("default_delivery_slot_cost", "5"),
    ("default_delivery_slot_loan", "3"),
    ("default_delivery_slot_discount", "50"),
    ("default_minimum_delivery_slots", "3"),
    ("initial_destination_concurrency", "5"),
    ("default_destination_concurrency_limit", "20"),
    ("default_destination_recipient_limit", "50"),
    ("default_destination_concurrency_positive_feedback", "1"),
    ("default_destination_concurrency_negative_feedback", "1"),
    ("default_destination_concurrency_failed_cohort_limit", "1"),
    ("default_destination_rate_delay", "0s"),
    ("default_transport_rate_delay", "0s"),
    ("default_process_limit", "100"),
    ("transport_retry_time", "60s"),
    ("minimal_backoff_time", "300s"),
    ("maximal_backoff_time", "4000s"),
    ("queue_run_delay", "300s"),
    ("maximal_queue_lifetime", "5d"),
    ("bounce_queue_lifetime", "5d"),
    ("delay_warning_time", "0h"),
    ("defer_transports", ""),
    ("smtp_connection_cache_on_demand", "yes"),
    ("smtp_connection_cache_destinations", ""),
    ("smtp_connection_cache_time_limit", "2s"),
    ("smtp_connection_reuse_time_limit", "300s"),
    ("smtp_connection_reuse_count_limit", "0"),
    ("connection_cache_ttl_limit", "2s"),
    ("smtp_tls_connection_reuse", "no"),
    ("smtp_mx_address_limit", "5"),
    ("smtp_mx_session_limit", "2"),
    ("smtp_randomize_addresses", "yes"),
    ("smtp_balance_inet_protocols", "yes"),
    ("smtp_address_preference", "any"),
    ("smtp_skip_5xx_greeting", "yes"),
    ("smtp_defer_if_no_mx_address_found", "no"),
    ("ignore_mx_lookup_error", "no"),
    ("smtp_fallback_relay", "$fallback_relay"),
    ("smtp_connect_timeout", "30s"),
    ("smtp_helo_timeout", "300s"),
    ("smtp_mail_timeout", "300s"),
    ("smtp_rcpt_timeout", "300s"),
    ("smtp_data_init_timeout", "120s"),
    ("smtp_data_xfer_timeout", "180s"),
    ("smtp_data_done_timeout", "600s"),
    ("smtp_quit_timeout", "300s"),
    ("smtp_rset_timeout", "20s"),
    ("smtp_starttls_timeout", "300s"),
    ("soft_bounce", "no"),
]

# The rest of the product's parameters named by the intake issue.
PRODUCT = [
    ("relayhost", ""),
    ("default_transport", "smtp"),
    ("transport_maps", ""),
    ("fallback_relay", ""),
    ("smtp_helo_name", "$myhostname"),
    ("smtp_tls_security_level", ""),
    ("smtp_tls_CAfile", ""),
    ("smtp_dns_nameservers", ""),
    ("mynetworks", "127.0.0.0/8 [::1]/128"),
    ("message_size_limit", "10240000"),
    ("smtpd_recipient_limit", "1000"),
    ("smtpd_timeout", "300s"),
    ("smtpd_listen", "127.0.0.1:25"),
    ("queue_directory", "/var/spool/qmgrd"),
    ("maillog_file", ""),
    ("log_format", "postfix"),
    ("shutdown_timeout", "30s"),
    ("metrics_listen", ""),
    ("double_bounce_sender", "double-bounce"),
    ("mail_name", "qmgrd"),
    ("recipient_delimiter", ""),
    ("local_destination_concurrency_limit", "2"),
    ("local_destination_recipient_limit", "1"),
    ("smtpd_sasl_auth_enable", "no"),
]


@pytest.mark.parametrize(("name", "default"), NOTES_12 + PRODUCT)
def test_declared_with_postfix_default(name: str, default: str) -> None:
    """Every parameter the notes and the intake issue name is declared with that default."""
    param = find_param(name)
    assert param is not None, name
    assert param.default == default


def test_computed_defaults_are_flagged() -> None:
    """myhostname and mydomain defaults come from the host, so the table marks them computed."""
    assert PARAMS["myhostname"].computed
    assert PARAMS["mydomain"].computed
    assert not PARAMS["smtp_helo_name"].computed


def test_per_transport_set_is_the_notes_t_parameters() -> None:
    """Exactly the notes' <t>_ parameters are per-transport, keyed by their suffix."""
    assert set(PER_TRANSPORT) == {
        "recipient_limit",
        "extra_recipient_limit",
        "recipient_refill_limit",
        "recipient_refill_delay",
        "delivery_slot_cost",
        "delivery_slot_loan",
        "delivery_slot_discount",
        "minimum_delivery_slots",
        "initial_destination_concurrency",
        "destination_concurrency_limit",
        "destination_recipient_limit",
        "destination_concurrency_positive_feedback",
        "destination_concurrency_negative_feedback",
        "destination_concurrency_failed_cohort_limit",
        "destination_rate_delay",
        "transport_rate_delay",
        "destination_concurrency_learning",
        "destination_throttle_delay",
        "fairness_key",  # qmgrd only: fair queuing between flows
        "destination_rate_limit",  # cluster (qmgrd.daemon.destgate)
    }
    assert PER_TRANSPORT["initial_destination_concurrency"].name == (
        "initial_destination_concurrency"
    )
    assert not PARAMS["smtp_helo_name"].per_transport


@pytest.mark.parametrize(
    ("name", "type_"),
    [
        ("default_destination_concurrency_positive_feedback", ParamType.STR),
        ("maximal_queue_lifetime", ParamType.TIME),
        ("soft_bounce", ParamType.BOOL),
        ("smtpd_listen", ParamType.LIST),
        ("mynetworks", ParamType.LIST),
        ("qmgr_message_active_limit", ParamType.INT),
    ],
)
def test_types(name: str, type_: ParamType) -> None:
    """Feedback values are strings (the core parses them); other types are as Postfix's."""
    assert PARAMS[name].type is type_


def test_bounds() -> None:
    """Slot discount is a percentage, concurrency limits may be 0, pools need at least 1."""
    discount = PARAMS["default_delivery_slot_discount"]
    assert (discount.minimum, discount.maximum) == (0, 100)
    assert PARAMS["default_destination_concurrency_limit"].minimum == 0
    assert PARAMS["initial_destination_concurrency"].minimum == 1
    assert PARAMS["default_recipient_limit"].minimum == 1
    assert PARAMS["maximal_queue_lifetime"].maximum == 100 * 86400


def test_time_units_of_bare_numbers() -> None:
    """Bare numbers use Postfix's per-parameter unit: days for lifetimes, hours for warnings."""
    assert PARAMS["maximal_queue_lifetime"].unit == "d"
    assert PARAMS["bounce_queue_lifetime"].unit == "d"
    assert PARAMS["delay_warning_time"].unit == "h"
    assert PARAMS["smtp_connect_timeout"].unit == "s"


def test_bounce_lifetime_clamp_declared() -> None:
    """bounce_queue_lifetime declares its clamp to maximal_queue_lifetime."""
    assert PARAMS["bounce_queue_lifetime"].at_most == "maximal_queue_lifetime"


def test_describe_yields_one_row_per_parameter_sorted() -> None:
    """describe() gives (name, type, default, per_transport, description) for docs, sorted."""
    rows = list(describe())
    assert len(rows) == len(PARAMS)
    assert [r[0] for r in rows] == sorted(PARAMS)
    by_name = {r[0]: r for r in rows}
    assert by_name["default_delivery_slot_cost"][1:4] == ("int", "5", True)
    for name, _type, _default, _pt, description in rows:
        assert description and "\n" not in description, name


@pytest.mark.parametrize(
    ("name", "services", "expected"),
    [
        (
            "relay_destination_recipient_limit",
            None,
            ("relay", "default_destination_recipient_limit"),
        ),
        ("relay_recipient_limit", None, ("relay", "default_recipient_limit")),
        ("x_initial_destination_concurrency", None, ("x", "initial_destination_concurrency")),
        ("relay_destination_concurrency_limit", frozenset({"smtp"}), None),
        (
            "relay_destination_concurrency_limit",
            frozenset({"relay"}),
            ("relay", "default_destination_concurrency_limit"),
        ),
        ("smtpd_recipient_limit", None, None),
        ("local_destination_concurrency_limit", None, None),
        ("default_destination_concurrency_limit", None, None),
        ("destination_concurrency_limit", None, None),
        ("smtp_connect_timeout", None, None),
    ],
)
def test_split_transport_name(
    name: str, services: frozenset[str] | None, expected: tuple[str, str] | None
) -> None:
    """t_<suffix> splits on the longest suffix, only for services, never for table names."""
    split = split_transport_name(name, services)
    assert (None if split is None else (split[0], split[1].name)) == expected


def test_param_rejects_inconsistent_declarations() -> None:
    """A per-transport parameter must be a default_ name; choices only apply to strings."""
    with pytest.raises(ValueError, match="default_"):
        Param("foo_limit", ParamType.INT, "1", "x", per_transport=True)
    with pytest.raises(ValueError, match="choices"):
        Param("foo", ParamType.INT, "1", "x", choices=("1",))
    with pytest.raises(ValueError, match="unit"):
        Param("foo", ParamType.TIME, "1", "x", unit="y")
