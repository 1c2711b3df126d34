"""What each kind of hostile request costs the application: sent one at a time, with the CPU time
each process role spent on it (replica, Serve's proxy, compile workers, cache shards) and the
statuses it got. The load run says whether the other tenants notice a hostile tenant; this says
which of its requests they would notice, and where the time goes.

    python loadtests/hostile_costs.py                       # every kind, 15 requests each, the tiny model
    python loadtests/hostile_costs.py slow_schema deep -n 30
    python loadtests/hostile_costs.py --fresh-keys slow_schema   # a new API key per request: no compile budget

It starts the application itself (loopback only) unless given `--url`; CPU times are read from
/proc for the processes it started (with `--url`, those of this machine's Ray workers are not
known, and only statuses and wall time are reported).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
import urllib.error
import urllib.request
from collections import Counter, defaultdict
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import workload as w
from run import app_processes, free_port


def cpu_by_role() -> dict[str, float]:
    out: dict[str, float] = defaultdict(float)
    for role, _rss, cpu in app_processes().values():
        out[role] += cpu
    return out


def send(url: str, body: dict | bytes, key: str, timeout: float = 60.0) -> int:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json",
                                                          "Authorization": f"Bearer {key}"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            r.read()
            return r.status
    except urllib.error.HTTPError as e:
        e.read()
        return e.code


def probe(url: str, kinds: list[str], n: int, fresh_keys: bool, model: str, pause_s: float = 0.05) -> list[dict]:
    tools = w.ToolPool(w.load_registry_tools(), seed=0, size=4).get(0).tools
    rows = []
    for kind in kinds:
        statuses: Counter = Counter()
        c0, t0 = cpu_by_role(), time.perf_counter()
        for i in range(n):
            rng = random.Random(f"{kind}/{i}")
            key = f"hostile-{kind}-{i}" if fresh_keys else f"hostile-{kind}-{i % 2}"
            statuses[send(url, w.hostile_body(kind, rng, model, tools), key)] += 1
            time.sleep(pause_s)
        wall = time.perf_counter() - t0 - n * pause_s
        time.sleep(1.0)     # what the request left running in the background (publishing, precompute)
        c1 = cpu_by_role()
        row = {"kind": kind, "requests": n, "statuses": dict(sorted(statuses.items())),
               "wall_ms_per_request": round(wall / n * 1e3, 1),
               "cpu_ms_per_request": {r: round((c1[r] - c0.get(r, 0.0)) / n * 1e3, 1) for r in sorted(c1)
                                      if r in ("replica", "proxy", "compile_worker", "shard")}}
        rows.append(row)
        print(f"{kind:<15} {row['statuses']}  wall {row['wall_ms_per_request']} ms/request  "
              f"CPU ms/request {row['cpu_ms_per_request']}", flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="loadtests/hostile_costs.py", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("kinds", nargs="*", choices=[[], *w.HOSTILE_KINDS], metavar="KIND",
                    help=f"of {', '.join(w.HOSTILE_KINDS)} (default: all)")
    ap.add_argument("-n", type=int, default=15, help="requests per kind (default 15, at most 1000)")
    ap.add_argument("--fresh-keys", action="store_true", help="a new API key per request (no compile budget)")
    ap.add_argument("--url", help="a running application (http://127.0.0.1:PORT/v1) instead of starting one")
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--json", help="write the rows here")
    args = ap.parse_args(argv)
    if not 1 <= args.n <= 1000:
        ap.error("-n must be within 1..1000")
    kinds = args.kinds or list(w.HOSTILE_KINDS)
    if args.url:
        if not args.url.startswith(("http://127.0.0.1", "http://localhost", "http://[::1]")):
            ap.error("targets the loopback only")
        rows = probe(args.url.removesuffix("/") + "/chat/completions", kinds, args.n, args.fresh_keys, args.model)
    else:
        from serve.cli import Server

        with Server(model=args.model, port=free_port(), progress=False, mask_service=False) as server:
            rows = probe(server.url + "/chat/completions", kinds, args.n, args.fresh_keys, args.model)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
