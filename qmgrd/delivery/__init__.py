"""delivery: the agents the engine calls (DESIGN §6) and DSN composition (DESIGN §7).

- ``agent``: the contract (DeliveryRequest → DeliveryResult).
- ``factory.create_agent(command, settings)``: master.cf command → agent.
- ``smtp.SmtpAgent``: SMTP routing (nexthop lists in ``nexthop``, ``smtp_fallback_relay``),
  MX lookup (``mx``) and a connection cache (``cache``); it delegates to ``session``
  (connect, greeting, EHLO, TLS, AUTH), ``tlspolicy`` (levels, policy maps, certificate
  checks), ``sasl`` (client AUTH), ``transaction`` (address checks, MAIL/RCPT/DATA),
  ``attempt`` (results, hop status) and ``replies`` (failures, reply rendering).
- ``simple``: discard / error / retry agents.
- ``settings.SmtpSettings``: the smtp_* parameters, ``from_transport(tv)``.
- ``content``: DATA encoding and an in-memory ContentSource.
- ``dsn``: RFC 3464 bounce / delay notices and NOTIFY filtering (``dsncopy``: the copy of
  the original and the MIME boundary).
"""
