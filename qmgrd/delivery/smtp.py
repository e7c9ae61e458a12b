"""The SMTP delivery agent (Postfix smtp(8) on our own client protocol; DESIGN §6, notes §10).

One ``SmtpAgent`` per master.cf transport, shared by that transport's
concurrent deliveries. ``deliver(request)`` never raises: every remote or local
problem becomes a ``DeliveryResult``. The agent routes; the other modules do
the rest: ``session`` (connect, TLS, AUTH), ``transaction`` (MAIL, RCPT, DATA,
address checks; pipelined when offered), ``client`` and ``connection`` (the
SMTP client protocol, sans-IO, and its asyncio adapter), ``tlspolicy``,
``sasl``, ``mx`` (DNS), ``attempt`` (results).

Theory of operation (one request):

1. Check every address: one that cannot be sent exactly as stored fails
   permanently (the sender: the whole message; a recipient: itself), before
   any connection, so it can never count against the destination.
2. Destinations: the nexthop (a list, tried in order: ``relayhost`` may name
   several), then ``smtp_fallback_relay``. Site-level failures at any but the
   last destination are soft (a "not found" primary falls back rather than
   bounce, as Postfix does).
3. For each destination, its TLS policy (``smtp_tls_policy_maps`` or the
   level), its addresses (``mx.MxResolver``); with ``smtp_randomize_addresses``
   equal-preference addresses are tried least recently used first
   (``mx.EndpointUsage``: fanf's load spreading over a destination's hosts); addresses at
   the best preference with a cached session are moved to the front.
4. Try addresses in order. Each counts toward ``smtp_mx_address_limit``; each
   session that got through the handshake (or came from the cache) counts
   toward ``smtp_mx_session_limit``. When either limit is reached this is the
   last address of the destination.
5. Error policy (smtp_trouble.c): a soft error leaves the recipient pending
   for the next address; a hard one (5xx) bounces it at once. Recipients still
   pending when everything was tried are deferred with their last error.
6. Hop status (negative feedback, notes §10.4): set when a recipient ends
   deferred by a site-level failure (connect, greeting, EHLO, TLS, AUTH, 421,
   lost connection or timeout, temporary DNS failure) and no session of this
   request completed a transaction.

Connection cache (notes §10.2): with the request's LOAD flag (or for
``smtp_connection_cache_destinations``) an idle session for the same nexthop
label, endpoint and SASL user is taken from the cache and probed with RSET
(pipelined with the envelope when the server offers PIPELINING; a session that
fails its probe is closed and the next one, or a new connection, is used);
with STORE a good session is returned to the cache instead of QUIT, unless it
is older than ``smtp_connection_reuse_time_limit``, was reused
``smtp_connection_reuse_count_limit`` times, or uses TLS while
``smtp_tls_connection_reuse`` is off. Whether a session will be kept is
decided before its transaction: one that will not be kept sends QUIT behind the
end of data when the server pipelines (``Transaction.run(last=True)``). Every
session ends with ``conversation.end_session``: with ``smtp_skip_quit_response``
(the default) the QUIT reply is not awaited, as Postfix's smtp_quit.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable

from qmgrd.delivery.agent import DeliveryRequest, DeliveryResult
from qmgrd.delivery.attempt import Attempt
from qmgrd.delivery.cache import CallLater, ConnectionCache
from qmgrd.delivery.mx import (
    Destination,
    DnsFailure,
    Endpoint,
    EndpointUsage,
    MxResolver,
    parse_nexthop,
)
from qmgrd.delivery.replies import Failure, dsn_param, reply_dsn, xtext
from qmgrd.delivery.sasl import SaslClient
from qmgrd.delivery.session import CacheKey, Connector, Session, SmtpStats, end_session
from qmgrd.delivery.settings import SmtpSettings
from qmgrd.delivery.tlspolicy import TlsClient
from qmgrd.delivery.transaction import StaleSession, Transaction, check_addresses
from qmgrd.errors import ConfigError
from qmgrd.log import get_logger

__all__ = ["SmtpAgent", "SmtpStats", "dsn_param", "reply_dsn", "xtext"]

ROUTE_CACHE_LIMIT = 4096  # nexthops whose parsed route an agent remembers


class SmtpAgent:
    """Deliver entries over SMTP, with MX fallback, TLS, AUTH and a connection cache."""

    def __init__(
        self,
        settings: SmtpSettings,
        *,
        resolver: MxResolver | None = None,
        rng: random.Random | None = None,
        clock: Callable[[], float] = time.monotonic,
        call_later: CallLater | None = None,
    ) -> None:
        """Create the agent; ConfigError for unusable TLS or SASL settings (CA file ...)."""
        self.settings = settings
        self.resolver = resolver or MxResolver(
            settings.dns_nameservers,
            timeout=settings.dns_timeout,
            rng=rng,
            randomize=settings.randomize_addresses,
            address_limit=settings.mx_address_limit,
            address_preference=settings.address_preference,
            balance_inet_protocols=settings.balance_inet_protocols,
            ignore_mx_lookup_error=settings.ignore_mx_lookup_error,
            defer_if_no_mx_address_found=settings.defer_if_no_mx_address_found,
        )
        self.clock = clock
        self.usage = EndpointUsage(settings.address_preference)
        self.stats = SmtpStats()
        self._log = get_logger("smtp")
        for warning in settings.warnings:
            self._log.warning(warning)
        self.tls = TlsClient(
            level=settings.tls_security_level,
            cafile=settings.tls_cafile,
            capath=settings.tls_capath,
            verify_cert_match=settings.tls_verify_cert_match,
            secure_cert_match=settings.tls_secure_cert_match,
            mandatory_protocols=settings.tls_mandatory_protocols,
            policy_maps=settings.tls_policy_maps,
        )
        self.sasl = SaslClient(
            enable=settings.sasl_auth_enable,
            password_maps=settings.sasl_password_maps,
            security_options=settings.sasl_security_options,
            tls_security_options=settings.sasl_tls_security_options,
            mechanism_filter=settings.sasl_mechanism_filter,
            sender_dependent=settings.sender_dependent_authentication,
            soft_bounce=settings.sasl_auth_soft_bounce,
        )
        self.connector = Connector(settings, self.tls, self.sasl, self.stats, clock, self._log)
        self.transaction = Transaction(settings)
        self.fallback = (
            tuple(parse_nexthop(" ".join(settings.fallback_relay)))
            if (settings.fallback_relay)
            else ()
        )
        self._routes: dict[str, tuple[Destination, ...] | str] = {}  # nexthop -> _route()
        self.cache: ConnectionCache[Session] = ConnectionCache(
            ttl=settings.connection_cache_time_limit,
            closer=self._quit,
            call_later=call_later,
        )

    # ----------------------------------------------------------------- public

    async def deliver(self, request: DeliveryRequest) -> DeliveryResult:
        """Attempt delivery of one entry; never raises for remote or local problems."""
        self.stats.deliveries += 1
        att = Attempt.start(request, soft_bounce=self.settings.soft_bounce)
        try:
            await self._deliver(att)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            # A bug met by one message stays with that message: not a destination failure.
            self._log.exception(
                "smtp agent internal error", queue_id=request.queue_id, error=repr(exc)
            )
            att.fail_pending(Failure("4.3.0", f"internal error in smtp agent: {exc!r}"))
        return att.finish()

    async def close(self) -> None:
        """QUIT and close every cached session."""
        await self.cache.close()

    # --------------------------------------------------------------- top level

    async def _deliver(self, att: Attempt) -> None:
        wire = check_addresses(att, self.transaction.rewrite)
        if wire is None or not att.pending:
            return
        route = self._route(att.request.nexthop)
        if isinstance(route, str):
            att.fail_pending(Failure("4.3.5", f"bad nexthop: {route}"))
            return
        for number, dest in enumerate(route, start=1):
            if not att.pending:
                return
            await self._try_destination(att, dest, wire, final=number == len(route))

    def _route(self, nexthop: str) -> tuple[Destination, ...] | str:
        """The destinations to try for ``nexthop`` (then the fallback relays), or why the
        nexthop is unusable; parsed once per nexthop (the syntax cannot change)."""
        route = self._routes.get(nexthop)
        if route is None:
            try:
                dests = parse_nexthop(nexthop)
                route = dests + tuple(d for d in self.fallback if d not in dests)
            except ConfigError as exc:
                route = str(exc)
            if len(self._routes) >= ROUTE_CACHE_LIMIT:
                self._routes.clear()
            self._routes[nexthop] = route
        return route

    def _caching(
        self, request: DeliveryRequest, dest: Destination, label: str
    ) -> tuple[bool, bool]:
        """(load, store) for this destination, ``label`` being its label (notes §10.2)."""
        s = self.settings
        always = label in s.connection_cache_destinations or (
            dest.host in s.connection_cache_destinations
        )
        if always:
            return True, True
        if s.connection_cache_on_demand:
            return request.cache_load, request.cache_store
        return False, False

    async def _try_destination(
        self, att: Attempt, dest: Destination, wire: dict[int, bytes], *, final: bool
    ) -> None:
        s = self.settings
        label = dest.label
        policy = self.tls.policy_for(dest)
        if isinstance(policy, Failure):
            self._log.warning(f"TLS policy lookup for {label}: unusable entry")
            att.fail_pending(policy, final=final)
            return
        load, store = self._caching(att.request, dest, label)
        t0 = self.clock()
        found = await self.resolver.lookup(dest)
        att.setup_time += self.clock() - t0
        if isinstance(found, DnsFailure):
            failure = Failure(found.dsn, found.reason, site=found.transient)
            att.fail_pending(failure, final=final)
            return
        sender = att.request.sender
        # SASL user per address ("" without AUTH: no lookup per delivery)
        users = {ep: self._user(sender, dest, ep) for ep in found} if self.sasl.enable else None
        several = len(found) > 1  # one address (a smarthost, a sink) has no order to choose
        endpoints = self.usage.spread(found) if s.randomize_addresses and several else found
        if load and several:
            best = endpoints[0].pref
            cached = [
                ep
                for ep in endpoints
                if ep.pref == best and self._has_cached(label, ep, users[ep] if users else "")
            ]
            if cached:
                endpoints = cached + [ep for ep in endpoints if ep not in cached]
        sessions = 0
        for count, ep in enumerate(endpoints, start=1):
            if not att.pending:
                return
            last_addr = count == len(endpoints) or (
                s.mx_address_limit > 0 and count >= s.mx_address_limit
            )
            t0 = self.clock()
            self.usage.used(ep, t0)  # tried, whatever the outcome: the next one goes elsewhere
            reused = load and await self._reuse(
                att, label, ep, users[ep] if users else "", wire, store
            )
            if not reused:
                creds = self.sasl.credentials(sender, dest, ep)
                opened = await self.connector.open(ep, dest, policy, creds)
                att.setup_time += self.clock() - t0
                if isinstance(opened, Failure):
                    att.fail_pending(opened, final=final)
                    if last_addr:
                        return
                    continue
                await self._transact(att, opened, wire, store=store, probe=False)
            sessions += 1
            if last_addr or (s.mx_session_limit > 0 and sessions >= s.mx_session_limit):
                return

    async def _transact(
        self, att: Attempt, session: Session, wire: dict[int, bytes], *, store: bool, probe: bool
    ) -> None:
        """The transaction on ``session``, then cache it, QUIT it or close it.

        ``StaleSession`` (a cached session failed its probe) goes to the caller.
        """
        t1 = self.clock()
        try:
            keep = store and self._may_reuse(session)
            reusable = await self.transaction.run(att, session, wire, last=not keep, probe=probe)
        except BaseException:  # stale, cancelled (shutdown) or a bug: never leak the socket
            session.close()
            raise
        att.xfer_time += self.clock() - t1
        if reusable and keep and not session.quit_sent and self._may_reuse(session):
            session.reuse_count += 1
            self.cache.store(session.key, session)
        elif reusable:
            await self._quit(session)
        else:
            session.close()

    def _user(self, sender: str, dest: Destination, ep: Endpoint) -> str:
        creds = self.sasl.credentials(sender, dest, ep)
        return creds.username if creds is not None else ""

    # ----------------------------------------------------------------- caching

    def _keys(self, label: str, ep: Endpoint, user: str) -> list[CacheKey]:
        return [(label, ep.host, ep.addr, ep.port, tls, user) for tls in (True, False)]

    def _has_cached(self, label: str, ep: Endpoint, user: str) -> bool:
        return any(key in self.cache for key in self._keys(label, ep, user))

    async def _reuse(
        self,
        att: Attempt,
        label: str,
        ep: Endpoint,
        user: str,
        wire: dict[int, bytes],
        store: bool,
    ) -> bool:
        """The transaction on a cached session for this endpoint and user, probed with RSET
        (``Transaction.run(probe=True)``); False when no cached session passed its probe."""
        for tls in (True, False):  # a TLS session first
            key = (label, ep.host, ep.addr, ep.port, tls, user)
            while (session := self.cache.take(key)) is not None:
                try:
                    await self._transact(att, session, wire, store=store, probe=True)
                except StaleSession:
                    continue  # closed by _transact; nothing was recorded
                self.stats.reused += 1
                return True
        return False

    def _may_reuse(self, session: Session) -> bool:
        s = self.settings
        if session.tls and not s.tls_connection_reuse:
            return False
        if self.clock() - session.created >= s.connection_reuse_time_limit:
            return False
        limit = s.connection_reuse_count_limit
        return not (limit > 0 and session.reuse_count >= limit)

    async def _quit(self, session: Session) -> None:
        """End a session politely (QUIT; ``smtp_skip_quit_response``), closing it."""
        s = self.settings
        await end_session(session, skip_reply=s.skip_quit_response, timeout=s.quit_timeout)
