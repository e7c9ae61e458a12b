"""SMTP AUTH for the listener: a password file of hashed secrets, PLAIN and LOGIN.

Password file (``smtpd_sasl_password_file``)
--------------------------------------------
One account per line, ``user:hash``; blank lines and lines starting with ``#``
are ignored; a user name may not contain ``:``. Two hash formats, both with a
random salt and both checked in constant time:

- ``$pbkdf2-sha256$ITERATIONS$SALT$HASH`` (PBKDF2-HMAC-SHA256, the default;
  600,000 iterations as OWASP recommends in 2023),
- ``$scrypt$n=N,r=R,p=P$SALT$HASH`` (``hashlib.scrypt``),

where SALT and HASH are base64 without padding. Generate a line with::

    python -m qmgrd.listener.auth hash alice        # asks for the password
    printf 'secret' | python -m qmgrd.listener.auth hash alice --stdin

Plain-text passwords are refused when the file is loaded (ConfigError naming
the line), so a file copied from a Postfix sasldb dump cannot silently work.

Mechanisms and transport security
---------------------------------
PLAIN (RFC 4616) and LOGIN (draft-murchison-sasl-login) send the password in
the clear, so they are offered only on a secure channel: TLS (STARTTLS or
wrapper mode, ``smtpd_tls_*``), or a client on a loopback address (the bytes
never leave the host) unless ``smtpd_tls_auth_only = yes``
(:func:`auth_allowed`). A client outside loopback never gets AUTH without
TLS, whatever ``smtpd_tls_auth_only`` says; on a listener that offers
STARTTLS, a loopback client outside ``mynetworks`` must use it too (the
session checks that). An authenticated client may relay even from outside
``mynetworks`` (Postfix's ``permit_sasl_authenticated``).

Checking a password costs tens to hundreds of milliseconds of CPU on purpose;
the listener runs :meth:`Credentials.verify` on a :class:`PasswordChecker`: its
own small thread pool (half the cores, at least one), never the threads that
write the spool, with a bounded number of checks waiting. When that many are
already queued, AUTH is answered ``454 4.7.0 Temporary authentication
failure`` at once, so an AUTH flood costs a bounded amount of CPU and cannot
delay an ordinary client's mail. An unknown user is checked against a dummy
hash so timing does not reveal which user names exist.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import binascii
import getpass
import hashlib
import hmac
import ipaddress
import os
import sys
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

from qmgrd.errors import ConfigError

__all__ = [
    "Credentials",
    "PasswordChecker",
    "auth_allowed",
    "decode_plain",
    "hash_password",
    "load_password_file",
    "main",
    "verify_hash",
]

PBKDF2_ITERATIONS = 600_000
SCRYPT_N, SCRYPT_R, SCRYPT_P = 1 << 15, 8, 1
_SCRYPT_MAXMEM = 128 * 1024 * 1024  # hashlib's default (32 MiB) is too small for n=2**15, r=8
_SALT_BYTES = 16
_MAX_ITERATIONS = 10_000_000  # a larger count in the file is a typo or an attack on our CPU


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii").rstrip("=")


def _unb64(text: str) -> bytes:
    return base64.b64decode(text + "=" * (-len(text) % 4), validate=True)


def hash_password(
    password: str,
    *,
    scheme: str = "pbkdf2-sha256",
    iterations: int = PBKDF2_ITERATIONS,
    salt: bytes | None = None,
) -> str:
    """A password-file hash of ``password`` (``scheme``: pbkdf2-sha256 or scrypt)."""
    salt = salt if salt is not None else os.urandom(_SALT_BYTES)
    secret = password.encode("utf-8")
    if scheme == "pbkdf2-sha256":
        digest = hashlib.pbkdf2_hmac("sha256", secret, salt, iterations)
        return f"$pbkdf2-sha256${iterations}${_b64(salt)}${_b64(digest)}"
    if scheme == "scrypt":
        digest = hashlib.scrypt(
            secret, salt=salt, n=SCRYPT_N, r=SCRYPT_R, p=SCRYPT_P, maxmem=_SCRYPT_MAXMEM, dklen=32
        )
        return f"$scrypt$n={SCRYPT_N},r={SCRYPT_R},p={SCRYPT_P}${_b64(salt)}${_b64(digest)}"
    raise ValueError(f"unknown password hash scheme {scheme!r}")


def _check_format(hashed: str) -> None:
    """Raise ValueError unless ``hashed`` is a hash this module can verify."""
    parts = hashed.split("$")
    if len(parts) != 5 or parts[0] != "":
        raise ValueError("not a $scheme$params$salt$hash string")
    _, scheme, params, salt, digest = parts
    try:
        _unb64(salt)
        _unb64(digest)
    except (binascii.Error, ValueError):
        raise ValueError("salt or hash is not base64") from None
    if scheme == "pbkdf2-sha256":
        if not params.isdigit() or not 1 <= int(params) <= _MAX_ITERATIONS:
            raise ValueError(f"bad iteration count {params!r}")
    elif scheme == "scrypt":
        _scrypt_params(params)
    else:
        raise ValueError(f"unknown scheme {scheme!r} (use pbkdf2-sha256 or scrypt)")


def _scrypt_params(text: str) -> tuple[int, int, int]:
    try:
        fields = dict(item.split("=", 1) for item in text.split(","))
        n, r, p = int(fields["n"]), int(fields["r"]), int(fields["p"])
    except (KeyError, ValueError):
        raise ValueError(f"bad scrypt parameters {text!r}") from None
    if n < 2 or n & (n - 1) or not 1 <= r <= 64 or not 1 <= p <= 16 or n * r > 1 << 24:
        raise ValueError(f"bad scrypt parameters {text!r}")
    return n, r, p


def verify_hash(password: str, hashed: str) -> bool:
    """Whether ``password`` matches ``hashed`` (a format checked at load time)."""
    _, scheme, params, salt_text, digest_text = hashed.split("$")
    salt, expected = _unb64(salt_text), _unb64(digest_text)
    secret = password.encode("utf-8", "surrogateescape")
    if scheme == "pbkdf2-sha256":
        actual = hashlib.pbkdf2_hmac("sha256", secret, salt, int(params), len(expected))
    else:
        n, r, p = _scrypt_params(params)
        actual = hashlib.scrypt(
            secret, salt=salt, n=n, r=r, p=p, maxmem=_SCRYPT_MAXMEM, dklen=len(expected)
        )
    return hmac.compare_digest(actual, expected)


@dataclass(frozen=True, slots=True)
class Credentials:
    """The accounts of a password file: user name -> hash (immutable, shared by sessions)."""

    accounts: Mapping[str, str]
    dummy: str  # hashed like the first account, checked for unknown users (timing)

    def verify(self, user: str, password: str) -> bool:
        """Whether the pair is valid; slow on purpose, call it from a worker thread."""
        hashed = self.accounts.get(user)
        if hashed is None:
            verify_hash(password, self.dummy)
            return False
        return verify_hash(password, hashed)


class PasswordChecker:
    """Password checks on their own bounded thread pool (see the module docstring)."""

    __slots__ = ("_pending", "_pool", "max_pending", "workers")

    def __init__(self, workers: int = 0, max_waiting: int = 0) -> None:
        self.workers = workers or max(1, (os.cpu_count() or 2) // 2)
        self.max_pending = self.workers + (max_waiting or 4 * self.workers)
        self._pool = ThreadPoolExecutor(self.workers, thread_name_prefix="qmgrd-sasl")
        self._pending = 0

    @property
    def pending(self) -> int:
        """Checks running or waiting."""
        return self._pending

    async def check(self, creds: Credentials, user: str, password: str) -> bool | None:
        """Whether the pair is valid; None without checking when too many checks wait."""
        if self._pending >= self.max_pending:
            return None
        self._pending += 1
        try:
            loop = asyncio.get_running_loop()
            return await loop.run_in_executor(self._pool, creds.verify, user, password)
        finally:
            self._pending -= 1

    def close(self) -> None:
        """Drop waiting checks; running ones finish in the background."""
        self._pool.shutdown(wait=False, cancel_futures=True)


def parse_password_file(text: str, source: str) -> Credentials:
    """Parse the file's text; ConfigError names ``source`` and the line of a bad entry."""
    accounts: dict[str, str] = {}
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        user, colon, hashed = line.partition(":")
        user, hashed = user.strip(), hashed.strip()
        where = f"{source}, line {number}"
        if not colon or not user or not hashed:
            raise ConfigError(f"{where}: expected user:hash")
        if not user.isprintable() or " " in user:
            raise ConfigError(f"{where}: bad user name {user!r}")
        try:
            _check_format(hashed)
        except ValueError as exc:
            raise ConfigError(
                f"{where}: {exc}; generate with: python -m qmgrd.listener.auth hash {user}"
            ) from None
        if user in accounts:
            raise ConfigError(f"{where}: duplicate user {user!r}")
        accounts[user] = hashed
    if accounts:
        first = next(iter(accounts.values()))
        dummy = _dummy_like(first)
    else:
        dummy = hash_password("", iterations=PBKDF2_ITERATIONS, salt=b"\0" * _SALT_BYTES)
    return Credentials(MappingProxyType(accounts), dummy)


def _dummy_like(hashed: str) -> str:
    """A hash with the same cost as ``hashed`` that no password matches knowingly."""
    _, scheme, params, salt, digest = hashed.split("$")
    return f"${scheme}${params}${salt}${_b64(bytes(len(_unb64(digest))))}"


def load_password_file(path: Path) -> Credentials:
    """Read and parse ``smtpd_sasl_password_file`` (ConfigError if unreadable or malformed)."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"smtpd_sasl_password_file: cannot read {path}: {exc}") from None
    return parse_password_file(text, str(path))


def auth_allowed(client_addr: str, *, tls: bool, auth_only: bool = False) -> bool:
    """Whether PLAIN/LOGIN may be offered: over TLS, or (unless ``auth_only``) to loopback."""
    if tls:
        return True
    if auth_only:
        return False
    try:
        ip = ipaddress.ip_address(client_addr.split("%", 1)[0])
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped.is_loopback
    return ip.is_loopback


def decode_plain(blob: bytes) -> tuple[str, str] | None:
    """RFC 4616 ``authzid NUL authcid NUL passwd`` -> (user, password), or None if malformed.

    An authorization identity other than empty or the user itself is refused
    (no proxy authorization).
    """
    parts = blob.split(b"\0")
    if len(parts) != 3:
        return None
    try:
        authzid, user, password = (p.decode("utf-8") for p in parts)
    except UnicodeDecodeError:
        return None
    if not user or (authzid and authzid != user):
        return None
    return user, password


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m qmgrd.listener.auth hash USER``: print a password-file line."""
    parser = argparse.ArgumentParser(prog="python -m qmgrd.listener.auth")
    sub = parser.add_subparsers(dest="command", required=True)
    cmd = sub.add_parser("hash", help="print a user:hash line for smtpd_sasl_password_file")
    cmd.add_argument("user")
    cmd.add_argument("--scheme", choices=("pbkdf2-sha256", "scrypt"), default="pbkdf2-sha256")
    cmd.add_argument("--iterations", type=int, default=PBKDF2_ITERATIONS)
    cmd.add_argument("--stdin", action="store_true", help="read the password from stdin")
    args = parser.parse_args(argv)
    if ":" in args.user or not args.user.strip():
        parser.error("the user name may not be empty or contain ':'")
    if args.stdin:
        password = sys.stdin.readline().rstrip("\r\n")
    else:
        password = getpass.getpass("Password: ")
        if getpass.getpass("Again: ") != password:
            print("passwords differ", file=sys.stderr)
            return 1
    hashed = hash_password(password, scheme=args.scheme, iterations=args.iterations)
    print(f"{args.user}:{hashed}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
