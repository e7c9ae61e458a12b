"""delivery: the agents the engine calls (DESIGN §6) and DSN composition (DESIGN §7).

- ``agent``: the contract (DeliveryRequest → DeliveryResult).
- ``factory.create_agent(command, settings)``: master.cf command → agent.
- ``smtp.SmtpAgent``: SMTP with MX lookup (``mx``), STARTTLS and a connection cache (``cache``).
- ``simple``: discard / error / retry agents.
- ``settings.SmtpSettings``: the smtp_* parameters, ``from_transport(tv)``.
- ``content``: DATA encoding and an in-memory ContentSource.
- ``dsn``: RFC 3464 bounce / delay notices and NOTIFY filtering.
"""
