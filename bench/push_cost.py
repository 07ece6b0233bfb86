"""What a live push costs when sync code on no serving loop sends it (a management command,
a host project's WSGI view, a script): `approvals.live.publisher.send`, which runs it on the
one loop the process keeps for that, against what it did before, `async_to_sync` (a new
thread and event loop per push, and on Redis a new connection), in one process, alternating
rounds.

    python bench/push_cost.py                              # in-memory channel layer
    python bench/push_cost.py --redis redis://127.0.0.1:6379/7 --n 200

Each push is a decision's two messages (the inbox group and the run's group), sent to
groups nobody listens to. Prints CPU and wall time per push, per round and the median.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=300, help="pushes per round and way (default 300)")
    ap.add_argument("--rounds", type=int, default=5, help="alternating rounds (default 5)")
    ap.add_argument("--redis", help="a Redis URL: channels-redis instead of the in-memory layer")
    args = ap.parse_args()

    sys.path.insert(0, str(ROOT))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "toolnexus_web.settings")
    os.environ.setdefault("DJANGO_SECRET_KEY", "bench")
    os.environ["DJANGO_DEBUG"] = "0"
    os.environ.pop("REDIS_URL", None)
    if args.redis:
        os.environ["REDIS_URL"] = args.redis
    import django

    django.setup()
    from asgiref.sync import async_to_sync
    from channels.layers import get_channel_layer

    from approvals.live import publisher

    layer = get_channel_layer()
    messages = [
        ("approvals.bench.inbox", {"type": "approvals.request", "request_pk": 1}),
        ("approvals.bench.run", {"type": "approvals.run", "run_id": 1}),
    ]

    def one_loop() -> None:
        publisher.send(messages)

    def loop_per_push() -> None:
        async_to_sync(publisher._send_all)(layer, messages)

    ways = {"one loop per process (now)": one_loop, "a loop per push (before)": loop_per_push}
    for fn in ways.values():  # warm-up: imports, the first connection
        for _ in range(10):
            fn()
    results: dict[str, list[tuple[float, float]]] = {name: [] for name in ways}
    print(
        f"live push from sync code, {type(layer).__name__}; n={args.n} per round and way, "
        f"{args.rounds} rounds, order alternating"
    )
    for rnd in range(args.rounds):
        order = list(ways.items()) if rnd % 2 == 0 else list(reversed(ways.items()))
        for name, fn in order:
            t0, c0 = time.perf_counter(), time.process_time()
            for _ in range(args.n):
                fn()
            wall = 1000 * (time.perf_counter() - t0) / args.n
            cpu = 1000 * (time.process_time() - c0) / args.n
            results[name].append((cpu, wall))
            print(f"  round {rnd + 1}  {name:<28} CPU {cpu:6.3f} ms  wall {wall:6.3f} ms per push")
    print()
    print(f"{'median over rounds, per push':<40} {'CPU ms':>8} {'wall ms':>8}")
    for name, rows in results.items():
        cpu = statistics.median(r[0] for r in rows)
        wall = statistics.median(r[1] for r in rows)
        print(f"{name:<40} {cpu:8.3f} {wall:8.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
