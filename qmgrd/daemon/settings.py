"""Turn a loaded `Config` into the plain objects the engine and the core take.

The core never sees `Config` (it imports nothing of the project); this module is
the one place that knows which main.cf parameter feeds which core field, so a
reload builds fresh objects here and pushes them into the running scheduler.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from qmgrd.config import Config
from qmgrd.config.maps import transport_find
from qmgrd.core.feedback import parse_feedback
from qmgrd.core.params import SchedulerParams, TransportParams
from qmgrd.core.resolve import ResolverSettings, TransportTable
from qmgrd.delivery.factory import AGENT_COMMANDS, agent_name
from qmgrd.delivery.settings import open_lookup


@dataclass(frozen=True, slots=True)
class EngineSettings:
    """What the engine itself decides with: scans, backoff, expiry, warnings, identities."""

    queue_directory: Path
    myhostname: str
    mail_name: str
    queue_run_delay: float
    minimal_backoff_time: float
    maximal_backoff_time: float
    maximal_queue_lifetime: float
    bounce_queue_lifetime: float
    delay_warning_time: float
    qmgr_message_active_limit: int
    shutdown_timeout: float
    recipient_delimiter: str
    double_bounce_sender: str
    bounce_size_limit: int = 50000  # bytes of the original a notice may return (compose_dsn)


def engine_settings(cfg: Config) -> EngineSettings:
    """The engine's own parameters."""
    return EngineSettings(
        queue_directory=cfg.get_path("queue_directory"),
        myhostname=cfg.get_str("myhostname"),
        mail_name=cfg.get_str("mail_name"),
        queue_run_delay=float(cfg.get_time("queue_run_delay")),
        minimal_backoff_time=float(cfg.get_time("minimal_backoff_time")),
        maximal_backoff_time=float(cfg.get_time("maximal_backoff_time")),
        maximal_queue_lifetime=float(cfg.get_time("maximal_queue_lifetime")),
        bounce_queue_lifetime=float(cfg.get_time("bounce_queue_lifetime")),
        delay_warning_time=float(cfg.get_time("delay_warning_time")),
        qmgr_message_active_limit=cfg.get_int("qmgr_message_active_limit"),
        shutdown_timeout=float(cfg.get_time("shutdown_timeout")),
        recipient_delimiter=cfg.get_str("recipient_delimiter"),
        double_bounce_sender=cfg.get_str("double_bounce_sender"),
        bounce_size_limit=cfg.get_int("bounce_size_limit"),
    )


def scheduler_params(cfg: Config) -> SchedulerParams:
    """Global scheduler limits (notes §6)."""
    return SchedulerParams(
        qmgr_message_active_limit=cfg.get_int("qmgr_message_active_limit"),
        qmgr_message_recipient_limit=cfg.get_int("qmgr_message_recipient_limit"),
        qmgr_message_recipient_minimum=cfg.get_int("qmgr_message_recipient_minimum"),
        minimal_backoff_time=float(cfg.get_time("minimal_backoff_time")),
        transport_retry_time=float(cfg.get_time("transport_retry_time")),
    )


def transport_params_fn(
    cfg: Config, warn: Callable[[str], None]
) -> Callable[[str], TransportParams]:
    """A memoizing ``transport_params(name)`` for the scheduler.

    Feedback strings are parsed here; a bad one falls back to 1 with a warning,
    as Postfix does. A transport that master.cf does not define gets the
    defaults (its deliveries then fail as "mail transport unavailable").
    """
    cache: dict[str, TransportParams] = {}

    def params(name: str) -> TransportParams:
        found = cache.get(name)
        if found is not None:
            return found
        made = _transport_params(cfg, name, warn) if name in cfg.master else TransportParams()
        cache[name] = made
        return made

    return params


def _transport_params(cfg: Config, name: str, warn: Callable[[str], None]) -> TransportParams:
    tv = cfg.transport(name)
    positive, pos_warning = parse_feedback(tv.get_str("destination_concurrency_positive_feedback"))
    negative, neg_warning = parse_feedback(tv.get_str("destination_concurrency_negative_feedback"))
    for warning in (pos_warning, neg_warning):
        if warning:
            warn(f"transport {name}: {warning}")
    return TransportParams(
        process_limit=cfg.master[name].maxproc,
        destination_concurrency_limit=tv.get_int("destination_concurrency_limit"),
        initial_destination_concurrency=tv.get_int("initial_destination_concurrency"),
        destination_recipient_limit=tv.get_int("destination_recipient_limit"),
        recipient_limit=tv.get_int("recipient_limit"),
        extra_recipient_limit=tv.get_int("extra_recipient_limit"),
        recipient_refill_limit=tv.get_int("recipient_refill_limit"),
        recipient_refill_delay=float(tv.get_time("recipient_refill_delay")),
        delivery_slot_cost=tv.get_int("delivery_slot_cost"),
        delivery_slot_loan=tv.get_int("delivery_slot_loan"),
        delivery_slot_discount=tv.get_int("delivery_slot_discount"),
        minimum_delivery_slots=tv.get_int("minimum_delivery_slots"),
        positive_feedback=positive,
        negative_feedback=negative,
        failed_cohort_limit=tv.get_int("destination_concurrency_failed_cohort_limit"),
        destination_rate_delay=float(tv.get_time("destination_rate_delay")),
        transport_rate_delay=float(tv.get_time("transport_rate_delay")),
        destination_concurrency_learning=tv.get_bool("destination_concurrency_learning"),
        destination_throttle_delay=float(tv.get_time("destination_throttle_delay")),
        # fair queuing between flows (qmgrd.daemon.flows checks these at load)
        fairness=tv.get_str("fairness_key") != "none",
        fairness_queue_count=cfg.get_int("fairness_queue_count"),
        fairness_hand_size=cfg.get_int("fairness_hand_size"),
    )


def resolver_settings(
    cfg: Config, read_file: Callable[[Path], str] | None = None
) -> ResolverSettings:
    """Routing settings; ``transport_maps`` and ``sender_dependent_relayhost_maps`` tables are
    opened here (the core never reads files).

    ``read_file`` is no longer used (the tables read and re-read their own files).
    """
    return ResolverSettings(
        default_transport=cfg.get_str("default_transport"),
        relayhost=cfg.get_str("relayhost"),
        transport_table=TransportTable(transport_find(cfg)),
        defer_transports=frozenset(cfg.get_list("defer_transports")),
        recipient_delimiter=cfg.get_str("recipient_delimiter"),
        sender_relayhost=open_lookup(cfg, "sender_dependent_relayhost_maps"),
    )


def delivery_services(cfg: Config) -> Mapping[str, str]:
    """master.cf delivery services: transport name → agent command."""
    out: dict[str, str] = {}
    for name, entry in cfg.master.items():
        command = agent_name(entry.command)
        if command in AGENT_COMMANDS:  # other services (qmgr, pickup, ...) deliver nothing
            out[name] = command
    return out
