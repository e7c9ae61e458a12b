"""The learned-limit parameters reach the scheduler's transport parameters (per transport)."""

from __future__ import annotations

from pathlib import Path

from qmgrd.config import load_config
from qmgrd.daemon.settings import transport_params_fn
from tests.support.config import write_config


def test_learning_defaults_and_per_transport_override(tmp_path: Path) -> None:
    """Learning is on with a 10 s throttle pause by default; ``relay_`` overrides turn it off
    for one transport and change its pause, and the others keep the defaults."""
    conf = write_config(
        tmp_path,
        "relay_destination_concurrency_learning = no\nrelay_destination_throttle_delay = 1m\n",
    )
    params = transport_params_fn(load_config(conf, hostname="mx.test"), lambda text: None)
    smtp, relay = params("smtp"), params("relay")
    assert (smtp.destination_concurrency_learning, smtp.destination_throttle_delay) == (True, 10.0)
    assert (relay.destination_concurrency_learning, relay.destination_throttle_delay) == (
        False,
        60.0,
    )
