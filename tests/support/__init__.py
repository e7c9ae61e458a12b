"""Shared test support: one copy of every helper the test modules used to repeat.

- ``clock``: ``FakeClock``, the time source tests move by hand (STYLE §4).
- ``waits``: ``Changes`` (event-driven waits on a watched object) and
  ``wait_until``, the one bounded poll, for state that changes with no event.
- ``logs``: ``watch_logs``, ``structlog.testing.capture_logs`` whose list can
  also be waited on.
- ``agents``: ``FakeAgent``, a delivery agent that answers by a rule, records
  and can be stalled at a gate.
- ``config``: ``write_config``, a ``main.cf``/``master.cf`` pair for a test
  daemon whose spool lives next to it; ``free_port``.
- ``engine``: an engine on a ``FakeClock`` with fake agents, ``submit``,
  ``run_until_idle``, ``stop_engine`` (engine tests).
- ``listener``: ``Listening``, an SMTP listener on 127.0.0.1 port 0 over a
  temporary spool, ``loopback_settings`` for it, and ``Chat``, a raw client.
- ``links``: ``record_placements``, the destinations of every ``os.link`` /
  ``os.rename`` (a held message must never be placed in ``incoming/``).
- ``process``: ``DaemonProcess``, ``qmgrd -c DIR run`` as a subprocess, ready
  when it says ``READY=1`` on its sd_notify socket, stopped on exit.

The in-process end-to-end daemon stays in ``tests.integration.e2e`` (it runs
``qmgrd.daemon.assemble.Daemon``, as ``qmgrd run`` does) and the SMTP sinks in
``tests.integration.sinks``; both use these pieces. Shared fixtures are in
``tests/conftest.py`` (a spool) and ``tests/integration/conftest.py`` (TLS).
"""
