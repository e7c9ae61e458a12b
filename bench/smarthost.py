"""Relay rate through a STARTTLS + AUTH smarthost, with the connection cache, vs plaintext.

    .venv/bin/python bench/smarthost.py                  # 2,000 x 1 KB, 20 clients, 3 modes
    .venv/bin/python bench/smarthost.py -n 5000 --modes tls-reuse,plain

Modes (the daemon's main.cf on top of bench/throughput.py's):

- ``plain``: no TLS, no AUTH (the baseline);
- ``tls-reuse``: ``smtp_tls_security_level = encrypt``, AUTH PLAIN with a
  password map, ``smtp_tls_connection_reuse = yes`` (TLS sessions go back to
  the connection cache);
- ``tls``: the same with Postfix's default ``smtp_tls_connection_reuse = no``
  (every delivery makes a new TLS session).

Each run starts the smarthost (aiosmtpd with STARTTLS and AUTH, a trustme
certificate) in its own process and the daemon in another (as
bench/throughput.py does: same ``serve`` as ``qmgrd run``, fsync on), injects N
messages from C sessions and waits for every ``status=sent`` line. It prints
messages/s end to end and, from the smarthost's counters, TCP connections, TLS
handshakes and AUTH exchanges per 1,000 messages. Nothing is asserted.

``--sink`` runs the smarthost itself (internal).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import signal
import ssl
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import bench.throughput as tp  # noqa: E402

MODES = {
    "plain": "",
    "tls-reuse": "smtp_tls_connection_reuse = yes\n",
    "tls": "smtp_tls_connection_reuse = no\n",
}
TLS_MAIN = (
    "smtp_tls_security_level = encrypt\n"
    "smtp_sasl_auth_enable = yes\n"
    "smtp_sasl_password_maps = texthash:{passwd}\n"
    "smtp_sasl_security_options = noanonymous\n"
)


# ---------------------------------------------------------------------- sink child


def _sink(certdir: str, tls: bool) -> None:
    """Child process: aiosmtpd smarthost; port on stdout, counters as JSON at stdin EOF."""
    import warnings

    warnings.simplefilter("ignore")  # aiosmtpd's notices (login_data deprecation) on stderr
    from aiosmtpd.smtp import SMTP, AuthResult, Envelope, Session

    counters = {"connections": 0, "tls": 0, "auth": 0, "messages": 0, "cpu_s": 0.0}
    ctx = None
    if tls:
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ctx.load_cert_chain(f"{certdir}/cert.pem", f"{certdir}/key.pem")

    class Handler:
        async def handle_DATA(self, server: Any, session: Session, envelope: Envelope) -> str:
            counters["messages"] += 1
            return "250 2.0.0 Ok"

    def authenticator(*_args: Any) -> AuthResult:
        counters["auth"] += 1
        return AuthResult(success=True)

    class Smarthost(SMTP):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            if not getattr(self, "_counted", False):
                self._counted = True
                counters["connections"] += 1
            super().connection_made(transport)

        async def smtp_STARTTLS(self, arg: str) -> None:
            counters["tls"] += 1
            await super().smtp_STARTTLS(arg)

    async def main() -> None:
        loop = asyncio.get_running_loop()
        server = await loop.create_server(
            lambda: Smarthost(
                Handler(),
                hostname="smarthost.bench",
                tls_context=ctx,
                authenticator=authenticator if tls else None,
                auth_required=tls,
                auth_require_tls=True,
            ),
            "127.0.0.1",
            0,
        )
        print(server.sockets[0].getsockname()[1], flush=True)
        await loop.run_in_executor(None, sys.stdin.read)
        counters["cpu_s"] = time.process_time()
        print(json.dumps(counters), flush=True)
        server.close()

    asyncio.run(main())


# ---------------------------------------------------------------------- one run


def run_once(args: argparse.Namespace, mode: str, certdir: Path) -> str:
    """Smarthost, daemon, injection, wait for the log; one result line."""
    root = Path(tempfile.mkdtemp(prefix="qmgrd-smarthost-"))
    tls = mode != "plain"
    sink = subprocess.Popen(
        [sys.executable, __file__, "--sink", str(certdir)] + (["--tls"] if tls else []),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    daemon: subprocess.Popen[bytes] | None = None
    try:
        assert sink.stdout is not None and sink.stdin is not None
        sink_port = int(sink.stdout.readline())
        port = tp._free_port()
        passwd = root / "sasl_passwd"
        passwd.write_text(f"[127.0.0.1]:{sink_port} bench:bench-password\n")
        passwd.chmod(0o600)
        extra = (TLS_MAIN.format(passwd=passwd) if tls else "") + MODES[mode]
        conf = tp._write_config(root, port, sink_port, extra)
        cmd = [sys.executable, tp.__file__, "--daemon", str(conf), "--loop", "uvloop"]
        daemon = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=str(REPO)
        )
        watch = tp.LogWatch(want_sent=args.n, want_removed=args.n)
        reader = threading.Thread(target=watch.follow, args=(daemon.stdout,), daemon=True)
        reader.start()
        if not watch.started.wait(60) or daemon.poll() is not None:
            raise RuntimeError("the daemon did not start")
        cpu0 = tp._cpu_seconds(daemon.pid)
        t0 = time.perf_counter()
        asyncio.run(tp._inject(port, args.n, args.clients, 1, tp._message(args.size)))
        if not watch.done.wait(tp.TIMEOUT):
            raise RuntimeError(f"not all delivered: sent={watch.sent} removed={watch.removed}")
        daemon_cpu = tp._cpu_seconds(daemon.pid) - cpu0
        elapsed = watch.last_sent - t0
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(60)
        sink.stdin.close()
        stats = json.loads(sink.stdout.readline())
        sink.wait(30)
        if stats["messages"] != args.n:
            raise RuntimeError(f"smarthost counted {stats} for {args.n} messages")
        per_k = 1000 / args.n
        return (
            f"mode={mode:<9} messages={args.n} rate={args.n / elapsed:6.0f} msg/s  "
            f"daemon_cpu={daemon_cpu * 1000 / args.n:6.3f} ms/msg  "
            f"connections/1000={stats['connections'] * per_k:6.1f}  "
            f"tls_handshakes/1000={stats['tls'] * per_k:6.1f}  "
            f"auth/1000={stats['auth'] * per_k:6.1f}  problems={watch.problems}"
        )
    finally:
        for proc in (daemon, sink):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait(30)
        shutil.rmtree(root, ignore_errors=True)


def main() -> None:
    """Parse arguments and run each mode once."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=2000, help="messages to relay")
    parser.add_argument("-c", "--clients", type=int, default=20, help="injecting sessions")
    parser.add_argument("--size", type=int, default=1024, help="message size in bytes")
    parser.add_argument("--modes", default="plain,tls-reuse,tls", help="comma-separated modes")
    parser.add_argument("--sink", help=argparse.SUPPRESS)
    parser.add_argument("--tls", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.sink:
        _sink(args.sink, args.tls)
        return
    import trustme

    certdir = Path(tempfile.mkdtemp(prefix="qmgrd-smarthost-certs-"))
    try:
        cert = trustme.CA().issue_cert("127.0.0.1")
        cert.cert_chain_pems[0].write_to_path(str(certdir / "cert.pem"))
        cert.private_key_pem.write_to_path(str(certdir / "key.pem"))
        for mode in args.modes.split(","):
            print(run_once(args, mode.strip(), certdir), flush=True)
    finally:
        shutil.rmtree(certdir, ignore_errors=True)


if __name__ == "__main__":
    main()
