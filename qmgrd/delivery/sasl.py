"""SMTP client AUTH (Postfix smtp(8) SASL: SASL_README, postconf(5) smtp_sasl_*).

Contract
--------
``SaslClient(...)`` is built once per transport; bad option words raise
``ConfigError`` naming the parameter. Per session:

- ``credentials(sender, dest, ep)`` finds ``username:password`` in
  ``smtp_sasl_password_maps``: with ``smtp_sender_dependent_authentication``
  first by sender (the address, then ``@domain``), then by destination: for
  ``[host]:port`` nexthops ``[host]:port`` and ``[host]``; then the server's
  host name; then the nexthop as written and its domain. No entry: no AUTH
  (as Postfix).
- ``mechanisms(offered, tls)`` keeps the server's mechanisms we implement
  (CRAM-MD5, PLAIN, LOGIN, strongest first) that pass
  ``smtp_sasl_mechanism_filter`` and the security options in force
  (``smtp_sasl_tls_security_options`` on a TLS session, else
  ``smtp_sasl_security_options``; default ``noplaintext, noanonymous``, so
  PLAIN and LOGIN are never used unless the operator allows them).
- ``authenticate(...)`` runs the exchange and returns None on 235, or a
  site-level ``Failure``: "SASL authentication failed; server X said: 535 ..."
  (4xx when ``smtp_sasl_auth_soft_bounce``), or "... no mechanism available".
  A failed AUTH is a destination failure and never a bounce by default.

Secrets: the password lives only in the table and in the local variables of
one exchange; no log line, exception text or result carries it (table errors
name the file and line, never the line's text).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from qmgrd.delivery.client import Reply
from qmgrd.delivery.mx import DEFAULT_PORT, Destination, Endpoint
from qmgrd.delivery.replies import Failure, reply_dsn, reply_text
from qmgrd.errors import ConfigError
from qmgrd.tables import LookupTable

SECURITY_OPTIONS = frozenset(
    {"noplaintext", "noactive", "nodictionary", "noanonymous", "mutual_auth", "forward_secrecy"}
)
MECHANISMS = ("CRAM-MD5", "PLAIN", "LOGIN")  # strongest first, as Cyrus SASL prefers
# Security properties of each mechanism (Cyrus SASL's flags): what each option excludes.
_EXCLUDED_BY = {
    "noplaintext": frozenset({"PLAIN", "LOGIN"}),
    "noactive": frozenset({"PLAIN", "LOGIN", "CRAM-MD5"}),
    "nodictionary": frozenset({"PLAIN", "LOGIN", "CRAM-MD5"}),
    "noanonymous": frozenset({"ANONYMOUS"}),
    "mutual_auth": frozenset({"PLAIN", "LOGIN", "CRAM-MD5"}),
    "forward_secrecy": frozenset({"PLAIN", "LOGIN", "CRAM-MD5"}),
}

Command = Callable[..., Awaitable[Reply]]


def parse_security_options(words: tuple[str, ...], param: str) -> frozenset[str]:
    """The option words, or ConfigError naming ``param`` for an unknown one."""
    out = set()
    for word in words:
        option = word.lower()
        if option not in SECURITY_OPTIONS:
            raise ConfigError(
                f"{param}: unknown SASL security option {word!r} "
                f"(expected: {', '.join(sorted(SECURITY_OPTIONS))})"
            )
        out.add(option)
    return frozenset(out)


@dataclass(frozen=True, slots=True)
class Credentials:
    """A username and password found in the password map (repr hides the password)."""

    username: str
    password: str

    def __repr__(self) -> str:
        """Never show the password."""
        return f"Credentials(username={self.username!r}, password=<hidden>)"


def auth_plain_encode(user: bytes, password: bytes) -> bytes:
    """The PLAIN initial response (RFC 4616): base64 of NUL user NUL password."""
    return base64.b64encode(b"\0" + user + b"\0" + password)


def auth_login_encode(user: bytes, password: bytes) -> tuple[bytes, bytes]:
    """The two LOGIN answers: base64 of the user name, then of the password."""
    return base64.b64encode(user), base64.b64encode(password)


def auth_crammd5_verify(user: bytes, password: bytes, challenge: str) -> bytes:
    """The CRAM-MD5 answer (RFC 2195): base64 of the user and the HMAC-MD5 of the challenge."""
    digest = hmac.new(password, base64.b64decode(challenge), hashlib.md5).hexdigest()
    return base64.b64encode(user + b" " + digest.encode("ascii"))


class SaslClient:
    """Credentials lookup, mechanism choice and the AUTH exchange for one transport."""

    def __init__(
        self,
        *,
        enable: bool,
        password_maps: tuple[LookupTable, ...] = (),
        security_options: tuple[str, ...] = ("noplaintext", "noanonymous"),
        tls_security_options: tuple[str, ...] | None = None,
        mechanism_filter: tuple[str, ...] = (),
        sender_dependent: bool = False,
        soft_bounce: bool = True,
    ) -> None:
        """Check the option lists; ConfigError naming the parameter on an unknown word."""
        self.enable = enable
        self.password_maps = password_maps
        self.options = parse_security_options(security_options, "smtp_sasl_security_options")
        self.tls_options = (
            self.options
            if tls_security_options is None
            else parse_security_options(tls_security_options, "smtp_sasl_tls_security_options")
        )
        self.mechanism_filter = frozenset(m.upper() for m in mechanism_filter)
        self.sender_dependent = sender_dependent
        self.soft_bounce = soft_bounce
        if enable and not password_maps:
            raise ConfigError(
                "smtp_sasl_auth_enable = yes needs smtp_sasl_password_maps "
                "(e.g. texthash:/etc/qmgrd/sasl_passwd)"
            )

    def credentials(self, sender: str, dest: Destination, ep: Endpoint) -> Credentials | None:
        """The credentials for this sender and server, in Postfix's lookup order."""
        if not self.enable:
            return None
        keys: list[str] = []
        if self.sender_dependent and sender:
            keys.append(sender)
            at = sender.rfind("@")
            if at >= 0:
                keys.append(sender[at:])
        if not dest.mx:
            bracketed = f"[{dest.host}]"
            keys.append(bracketed if dest.port == DEFAULT_PORT else f"{bracketed}:{dest.port}")
            keys.append(bracketed)
        keys += [ep.host, dest.label, dest.host]
        seen: set[str] = set()
        for key in keys:
            if key in seen:
                continue
            seen.add(key)
            for table in self.password_maps:
                value = table.lookup(key)
                if value is not None:
                    username, _sep, password = value.partition(":")
                    return Credentials(username, password)
        return None

    def mechanisms(self, offered: list[str], tls: bool) -> list[str]:
        """Offered mechanisms we may use, strongest first."""
        options = self.tls_options if tls else self.options
        excluded: set[str] = set()
        for option in options:
            excluded |= _EXCLUDED_BY[option]
        wanted = {m.upper() for m in offered}
        return [
            m
            for m in MECHANISMS
            if m in wanted
            and m not in excluded
            and (not self.mechanism_filter or m in self.mechanism_filter)
        ]

    async def authenticate(
        self,
        command: Command,
        creds: Credentials,
        offered: list[str],
        tls: bool,
        relay: str,
    ) -> Failure | None:
        """AUTH with the best usable mechanism; None on success, else a site-level failure.

        ``command(stage, *args)`` sends one command and returns the reply (it raises
        ``Lost`` when the connection breaks).
        """
        usable = self.mechanisms(offered, tls)
        if not usable:
            return Failure(
                "4.7.0",
                f"SASL authentication failed; cannot authenticate to server {relay}: "
                "no mechanism available",
                relay,
                site=True,
            )
        mech = usable[0]
        response = await self._exchange(command, mech, creds)
        if response.code == 235:
            return None
        dsn = reply_dsn(response.code, response.message)
        if dsn.startswith("5") and self.soft_bounce:
            dsn = "4" + dsn[1:]
        return Failure(
            dsn,
            f"SASL authentication failed; server {relay} said: {reply_text(response)}",
            relay,
            site=True,
        )

    @staticmethod
    async def _exchange(command: Command, mech: str, creds: Credentials) -> Reply:
        stage = "performing the SASL authentication"
        # Bytes as read from the table (surrogateescape): encoding can never raise an
        # exception whose repr would carry the password into a log line.
        user = creds.username.encode("utf-8", "surrogateescape")
        password = creds.password.encode("utf-8", "surrogateescape")
        if mech == "PLAIN":
            response = await command(stage, b"AUTH", b"PLAIN", auth_plain_encode(user, password))
            if response.code == 334:  # a server that wants the response on its own line
                response = await command(stage, auth_plain_encode(user, password))
            return response
        if mech == "LOGIN":
            encoded_user, encoded_password = auth_login_encode(user, password)
            response = await command(stage, b"AUTH", b"LOGIN")
            if response.code != 334:
                return response
            response = await command(stage, encoded_user)
            if response.code != 334:
                return response
            return await command(stage, encoded_password)
        response = await command(stage, b"AUTH", b"CRAM-MD5")
        if response.code != 334:
            return response
        try:
            base64.b64decode(response.message, validate=True)
        except ValueError:
            await command(stage, b"*")  # RFC 4954 §4: cancel the exchange
            return Reply(535, "5.7.0 invalid CRAM-MD5 challenge from server")
        return await command(stage, auth_crammd5_verify(user, password, response.message))
