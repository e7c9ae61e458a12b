"""The SMTP listener: our sans-IO SMTP protocol on the daemon's loop, relay policy, durable enqueue.

Public API::

    settings = ListenerSettings.from_config(cfg)          # or built directly in tests
    handle = await start_listener(settings, spool, on_commit=engine_wakeup)
    handle.addresses                                       # [(host, port)] actually bound
    handle.close(); await handle.wait_closed()

Replies follow Postfix's smtpd: clients outside ``mynetworks`` get ``554 5.7.1
<rcpt>: Relay access denied`` at RCPT; ``message_size_limit`` → ``552 5.3.4``;
more than ``smtpd_recipient_limit`` recipients → ``452 4.5.3``; bad recipient
syntax → ``501 5.1.3`` (sender: ``501 5.1.7``); a spool failure → ``451 4.3.0``;
success → ``250 2.0.0 Ok: queued as ID`` after the durable commit; a spool
file system too full for the message → ``452 4.3.1`` at MAIL.

SMTP AUTH (``smtpd_sasl_auth_enable``, ``smtpd_sasl_password_file``): PLAIN and
LOGIN, offered over TLS and, in clear text, only to loopback clients (and
when the listener offers STARTTLS, only to those also in ``mynetworks``); an
authenticated client may relay from outside ``mynetworks``. See
``qmgrd.listener.auth`` for the password file format and
``python -m qmgrd.listener.auth hash USER``.

TLS (``smtpd_tls_*``): STARTTLS at levels may/encrypt, wrapper mode, and the
certificate checks in ``qmgrd.listener.tls``; the byte channel that makes
STARTTLS safe against pipelined injection is ``qmgrd.listener.channel``.
Several listeners (smtpd_listen plus master.cf ``inet`` lines) are described
by ``qmgrd.listener.services.listener_settings``; each is one
``start_listener`` call sharing a group committer and password pool.

Layout: ``protocol`` (the sans-IO state machine: framing, DATA, dialogue
phases), ``session`` (the asyncio adapter, one per connection), ``commands``
(one handler per SMTP verb), ``esmtp`` and ``address`` (argument parsing),
``auth`` (password file, PLAIN/LOGIN, the password pool), ``tls``,
``channel``, ``services`` (which listeners), ``limits``
(per-client counters), ``server`` (accepting, admission, shutdown), ``binding``
(the listening sockets),
``settings``. Messages are written to the spool as they arrive
(``qmgrd.spool.writer``).
"""

from qmgrd.listener.server import ListenerHandle, start_listener
from qmgrd.listener.settings import ListenerSettings, parse_networks

__all__ = ["ListenerHandle", "ListenerSettings", "parse_networks", "start_listener"]
