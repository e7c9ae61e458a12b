"""Pure parameter objects for the scheduler (notes §12).

Contract
--------
``SchedulerParams`` holds the global queue-manager settings, ``TransportParams`` the settings of
one transport (``<t>_xxx`` already resolved against ``default_xxx`` by the configuration layer;
``process_limit`` is the master.cf maxproc). Both are frozen and validated on construction: an out
of range value raises ``ConfigError`` naming the parameter, because it came from the operator.

Derived values follow Postfix's ``qmgr_transport_create``: a non-zero ``destination_rate_delay``
forces the destination concurrency limit to 1 first, then the initial concurrency is clamped to the
limit (``effective_concurrency_limit`` / ``effective_initial_concurrency``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from qmgrd.core.feedback import Feedback
from qmgrd.errors import ConfigError

__all__ = ["READ_BATCH_LIMIT", "SchedulerParams", "TransportParams"]

READ_BATCH_LIMIT = 5000
"""At most this many recipients per read, to bound the latency of one event (notes §3.3)."""


def _at_least(name: str, value: float, low: float) -> None:
    if value < low:
        raise ConfigError(f"{name} = {value}: must be at least {low}")


@dataclass(frozen=True, slots=True)
class SchedulerParams:
    """Global scheduler settings (main.cf ``qmgr_*`` and backoff times)."""

    qmgr_message_active_limit: int = 20000
    qmgr_message_recipient_limit: int = 20000
    qmgr_message_recipient_minimum: int = 10
    minimal_backoff_time: float = 300.0
    transport_retry_time: float = 60.0

    def __post_init__(self) -> None:
        """Check bounds; Postfix raises the recipient limit to the active limit (notes §6)."""
        _at_least("qmgr_message_active_limit", self.qmgr_message_active_limit, 1)
        _at_least("qmgr_message_recipient_limit", self.qmgr_message_recipient_limit, 1)
        _at_least("qmgr_message_recipient_minimum", self.qmgr_message_recipient_minimum, 1)
        _at_least("minimal_backoff_time", self.minimal_backoff_time, 0.0)
        _at_least("transport_retry_time", self.transport_retry_time, 0.0)

    @property
    def recipient_limit(self) -> int:
        """``qmgr_message_recipient_limit``, raised to the active limit when set lower."""
        return max(self.qmgr_message_recipient_limit, self.qmgr_message_active_limit)


_ONE = Feedback(1.0, "constant")


@dataclass(frozen=True, slots=True)
class TransportParams:
    """One transport's scheduler settings (notes §2.1, §12)."""

    process_limit: int = 100  # master.cf maxproc; 0 = unlimited
    destination_concurrency_limit: int = 20  # 0 = unlimited
    initial_destination_concurrency: int = 5
    destination_recipient_limit: int = 50  # recipients per entry; 0 = unlimited
    recipient_limit: int = 20000  # transport recipient pool
    extra_recipient_limit: int = 1000  # stack reserve for preempting jobs
    recipient_refill_limit: int = 100
    recipient_refill_delay: float = 5.0
    delivery_slot_cost: int = 5
    delivery_slot_loan: int = 3
    delivery_slot_discount: int = 50
    minimum_delivery_slots: int = 3
    positive_feedback: Feedback = field(default=_ONE)
    negative_feedback: Feedback = field(default=_ONE)
    failed_cohort_limit: int = 1  # 0 = never dead by feedback
    destination_rate_delay: float = 0.0
    transport_rate_delay: float = 0.0
    destination_concurrency_learning: bool = True  # refusals while busy are "full" (scheduler)
    destination_throttle_delay: float = 10.0  # first pause after a throttling reply
    # fair queuing between flows (qmgrd.core.fairq): off = Postfix's schedules exactly
    fairness: bool = False  # <transport>_fairness_key is not none
    fairness_queue_count: int = 64  # fair queues of the transport (seed/APF default)
    fairness_hand_size: int = 8  # queues dealt to each flow (seed/APF default)

    def __post_init__(self) -> None:
        """Check bounds as Postfix's configuration tables do."""
        _at_least("process_limit", self.process_limit, 0)
        _at_least("destination_concurrency_limit", self.destination_concurrency_limit, 0)
        _at_least("initial_destination_concurrency", self.initial_destination_concurrency, 1)
        _at_least("destination_recipient_limit", self.destination_recipient_limit, 0)
        _at_least("recipient_limit", self.recipient_limit, 1)
        _at_least("extra_recipient_limit", self.extra_recipient_limit, 0)
        _at_least("recipient_refill_limit", self.recipient_refill_limit, 1)
        _at_least("recipient_refill_delay", self.recipient_refill_delay, 1.0)
        _at_least("delivery_slot_cost", self.delivery_slot_cost, 0)
        _at_least("delivery_slot_loan", self.delivery_slot_loan, 0)
        _at_least("minimum_delivery_slots", self.minimum_delivery_slots, 0)
        _at_least("failed_cohort_limit", self.failed_cohort_limit, 0)
        _at_least("destination_rate_delay", self.destination_rate_delay, 0.0)
        _at_least("transport_rate_delay", self.transport_rate_delay, 0.0)
        _at_least("destination_throttle_delay", self.destination_throttle_delay, 0.0)
        _at_least("fairness_queue_count", self.fairness_queue_count, 1)
        _at_least("fairness_hand_size", self.fairness_hand_size, 1)
        if self.fairness_hand_size > self.fairness_queue_count:
            raise ConfigError(
                f"fairness_hand_size = {self.fairness_hand_size}: must be at most "
                f"fairness_queue_count ({self.fairness_queue_count})"
            )
        if not 0 <= self.delivery_slot_discount <= 100:
            raise ConfigError(
                f"delivery_slot_discount = {self.delivery_slot_discount}: must be 0..100"
            )

    @property
    def effective_concurrency_limit(self) -> int:
        """The window cap: 1 when a destination rate delay is set (notes §2.1)."""
        if self.destination_rate_delay > 0:
            return 1
        return self.destination_concurrency_limit

    @property
    def effective_initial_concurrency(self) -> int:
        """The starting window, clamped to the (effective) limit when that is non-zero."""
        limit = self.effective_concurrency_limit
        init = self.initial_destination_concurrency
        return min(init, limit) if limit > 0 else init

    @property
    def slot_loan_factor(self) -> int:
        """``100 - delivery_slot_discount``, the percentage of expected slots to have."""
        return 100 - self.delivery_slot_discount
