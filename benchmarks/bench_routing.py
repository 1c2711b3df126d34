"""Grammar-affinity routing (serve/routing.py) against Serve's default router, on the same workload.

    python benchmarks/bench_routing.py [--quick] [--json FILE] [--routers affinity,default]
        [--requests N] [--concurrency C] [--imbalance K] [--seed S]

Routers (``--routers``): ``affinity`` (the default application), ``stateless`` (the same router
remembering nothing: rendezvous homes alone), ``default`` (Serve's proxy and router). Each gets a
fresh application (``serve.cli.Server(model="tiny", replicas=2, shards=1,
mask_service=False, options={"router": R, ...})``, loopback only, on this process's Ray: a local
one, or the cluster a caller already joined), so both start with cold caches, and is sent the same
requests in the same order.

**Workload** (``make_workload``, a function of the seed): tools of
``<shared>/data/tools/registry.jsonl`` as the load tests clean them (loadtests.workload.
load_registry_tools), sent without descriptions; each tool's popularity follows a Zipf law
(s = 1.1) over a seeded permutation. A request's tool set: a size drawn log-uniformly in [4, 32],
then tools drawn by popularity until it has that many or the next one would overflow the prompt
budget (1,700 estimated tokens: the tiny model has 2,048 positions), so large sets come out
smaller (the sizes sent are reported). A quarter of the requests send an earlier set again (drawn
uniformly); the rest are new as a whole, their tools mostly not. Body: one user message, the
tools, ``tool_choice="required"``, ``max_tokens=4``. ``C`` client threads (6), each
its own tenant (API key), send the requests in order, one at a time each; the per-tenant compile
CPU quota is off (``max_compile_seconds_per_tenant=None``): this measures placement, not quotas.

**Figures** per router:
- ``local_hit_rate``: per request, the fraction of its tools already in the chosen replica's caches
  (1 when its whole grammar is), averaged over requests. "Already there": sent to that replica by a
  request that had finished before this one was sent (the replica is the response's X-XG2-Replica).
  Caches are taken to keep all they got: the run's grammars and modules are far below a replica's
  budgets (64 MB of grammars, 128 MB of compiler caches). ``tool_hit_rate``: the same over all tools.
- From the replicas themselves (each response's X-XG2-Grammar header): ``grammar_from`` (local,
  joined, shards, compiled: where each request's grammar came from), ``module_local_rate`` (of the
  modules the compiles needed, the share found in the compiling process's own cache; the rest came
  from the cache shards or were lowered; a replica compiles in 2 worker processes, each with its
  own modules), ``process_hit_rate`` (per request: 1 when its grammar was in the replica or being
  compiled there, else its compile's module_local share, 0 from the shards; averaged: the same
  figure as benchmarks/bench_cluster.py's local_hit_rate), ``modules_lowered``, ``ready_ms``
  p50/p90 (arrival to open grammar session).
- ``latency_ms`` p50/p90 (client, whole request), ``per_replica`` (requests each answered),
  ``errors``.
- ``hop_ms`` p50: 30 sequential unconstrained requests (``max_tokens=1``) before the workload; the
  difference between routers is the ingress hop (the default router has none).

All timings share the machine's 2 cores with whatever else runs: compare routers within one run.
Prints JSON ``{"config": ..., "affinity": {...}, "default": {...}}``; ``--json FILE`` writes it.
``compare_routers`` (and ``drive``, for an application started elsewhere) is what a cluster
benchmark calls.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import socket
import statistics
import sys
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from loadtests import workload as w
from serve.ingress import request_affinity

MESSAGES = [{"role": "user", "content": "Call one of the tools."}]
#: The routers compared, as application options: the affinity router, the same without what it
#: learns (the rendezvous homes alone), Serve's default.
ROUTERS = {"affinity": {"router": "affinity"}, "stateless": {"router": "affinity", "routing_remembered_keys": 0},
           "default": {"router": "default"}}
PROMPT_BUDGET_TOKENS = 1700


def make_workload(n: int, *, seed: int = 0, zipf_s: float = 1.1, min_tools: int = 4, max_tools: int = 32,
                  repeat: float = 0.25, tools: list[dict] | None = None) -> list[list[dict]]:
    """`n` tool sets (see the module note)."""
    pool = [{"type": "function", "function": {k: v for k, v in t["function"].items() if k != "description"}}
            for t in (tools if tools is not None else w.load_registry_tools())]
    rng = random.Random(f"routing/{seed}")
    rng.shuffle(pool)
    costs = [w.estimate_tokens(json.dumps(t, ensure_ascii=False)) + 1 for t in pool]
    zipf = w.ZipfIndex(len(pool), zipf_s)
    sets: list[list[dict]] = []
    out = []
    for _ in range(n):
        if sets and rng.random() < repeat:
            out.append(rng.choice(sets))
            continue
        want = round(math.exp(rng.uniform(math.log(min_tools), math.log(max_tools + 0.49))))
        picked: dict[int, None] = {}
        budget = PROMPT_BUDGET_TOKENS
        for _try in range(want * 20):
            if len(picked) >= want:
                break
            i = zipf.draw(rng)
            if i in picked or costs[i] > budget:
                continue
            picked[i] = None
            budget -= costs[i]
        if len(picked) < min_tools:     # a budget filled by large tools: the cheapest of the rest
            for i in sorted(range(len(pool)), key=costs.__getitem__):
                if len(picked) >= min_tools:
                    break
                picked.setdefault(i, None)
        tool_set = [pool[i] for i in picked]
        sets.append(tool_set)
        out.append(tool_set)
    return out


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    values = sorted(values)
    return round(values[min(len(values) - 1, int(q * len(values)))], 2)


def _post(url: str, body: bytes, key: str, timeout: float = 120.0) -> tuple[int, dict, bytes]:
    request = urllib.request.Request(url, body, {"Authorization": f"Bearer {key}", "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as r:
            return r.status, dict(r.headers.items()), r.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers.items()), e.read()


def hop_latency(base_url: str, n: int = 30) -> float | None:
    """p50 of `n` sequential unconstrained one-token requests (ms)."""
    body = json.dumps({"model": "tiny", "messages": MESSAGES, "max_tokens": 1}).encode()
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        status, _h, _b = _post(base_url + "/chat/completions", body, "hop")
        if status == 200:
            times.append((time.perf_counter() - t0) * 1e3)
    return _pct(times, 0.5)


def drive(base_url: str, tool_sets: list[list[dict]], *, concurrency: int = 6, max_tokens: int = 4,
          tool_format: str = "qwen_3") -> dict[str, Any]:
    """Send the workload to a running application (`base_url` ends in /v1) and compute the figures
    (see the module note)."""
    bodies = [json.dumps({"model": "tiny", "messages": MESSAGES, "tools": ts, "tool_choice": "required",
                          "max_tokens": max_tokens}).encode() for ts in tool_sets]
    keys = [request_affinity("chat", b, tool_format=tool_format) for b in bodies]
    records: list[dict | None] = [None] * len(bodies)
    next_index = iter(range(len(bodies)))
    lock = threading.Lock()
    clock0 = time.perf_counter()

    def client(tenant: str) -> None:
        while True:
            with lock:
                i = next(next_index, None)
            if i is None:
                return
            start = time.perf_counter() - clock0
            status, headers, _body = _post(base_url + "/chat/completions", bodies[i], tenant)
            end = time.perf_counter() - clock0
            lower = {k.lower(): v for k, v in headers.items()}
            info = json.loads(lower["x-xg2-grammar"]) if "x-xg2-grammar" in lower else None
            records[i] = {"start": start, "end": end, "status": status, "replica": lower.get("x-xg2-replica"),
                          "grammar": info}

    threads = [threading.Thread(target=client, args=(f"bench-{k}",)) for k in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall_s = time.perf_counter() - clock0
    done = [(r, k) for r, k in zip(records, keys) if r is not None and r["status"] == 200 and k is not None]
    # what each replica holds by a request's start: the keys of its requests finished before then
    hits, tool_hits, tool_total = [], 0, 0
    for r, (grammar, tools) in done:
        held_grammars, held_tools = set(), set()
        for q, (g2, t2) in done:
            if q["replica"] == r["replica"] and q["end"] <= r["start"]:
                held_grammars.add(g2)
                held_tools.update(t2)
        if grammar in held_grammars:
            n_held = len(tools)
        else:
            n_held = sum(t in held_tools for t in tools)
        hits.append(n_held / len(tools) if tools else 1.0)
        tool_hits += n_held
        tool_total += len(tools)
    infos = [r["grammar"] for r, _k in done if r["grammar"]]
    modules = Counter()
    for info in infos:
        for k in ("modules_local", "modules_shards", "modules_lowered"):
            modules[k] += info.get(k, 0)
    needed = sum(modules.values())
    in_process = []         # the replica's own view of each request: its grammar, else its modules
    for info in infos:
        if info["from"] in ("local", "joined"):
            in_process.append(1.0)
        elif info["from"] == "compiled":
            n = sum(info.get(k, 0) for k in ("modules_local", "modules_shards", "modules_lowered"))
            in_process.append(info.get("modules_local", 0) / n if n else 0.0)
        else:
            in_process.append(0.0)
    sizes = sorted(len(ts) for ts in tool_sets)
    return {
        "requests": len(bodies), "answered": len(done), "wall_s": round(wall_s, 1),
        "errors": dict(Counter(str(r["status"]) for r in records if r is not None and r["status"] != 200)),
        "local_hit_rate": round(statistics.mean(hits), 4) if hits else None,
        "tool_hit_rate": round(tool_hits / tool_total, 4) if tool_total else None,
        "grammar_from": dict(Counter(i["from"] for i in infos)),
        "process_hit_rate": round(statistics.mean(in_process), 4) if in_process else None,
        "module_local_rate": round(modules["modules_local"] / needed, 4) if needed else None,
        "modules_lowered": modules["modules_lowered"], "modules_needed": needed,
        "ready_ms": {"p50": _pct([i["ready_ms"] for i in infos], 0.5), "p90": _pct([i["ready_ms"] for i in infos], 0.9)},
        "latency_ms": {"p50": _pct([(r["end"] - r["start"]) * 1e3 for r, _k in done], 0.5),
                       "p90": _pct([(r["end"] - r["start"]) * 1e3 for r, _k in done], 0.9)},
        "per_replica": dict(Counter(r["replica"] for r, _k in done)),
        "tools_per_set": {"min": sizes[0], "p50": sizes[len(sizes) // 2], "max": sizes[-1]} if sizes else None,
    }


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_router(router: str, tool_sets: list[list[dict]], *, concurrency: int = 6, imbalance: int | None = None,
               replicas: int = 2, model: str = "tiny", hop_requests: int = 30) -> dict[str, Any]:
    """One application with `router` (a ROUTERS name), the workload, the figures."""
    from serve.cli import Server

    if router not in ROUTERS:
        raise ValueError(f"unknown router {router!r}: one of {sorted(ROUTERS)}")
    options: dict[str, Any] = {**ROUTERS[router], "max_compile_seconds_per_tenant": None}
    if imbalance is not None:
        options["routing_imbalance"] = imbalance
    server = Server(model=model, port=_free_port(), replicas=replicas, shards=1, progress=False,
                    mask_service=False, options=options)
    t0 = time.perf_counter()
    server.start()
    try:
        started_s = time.perf_counter() - t0
        hop = hop_latency(server.url, hop_requests) if hop_requests else None
        out = drive(server.url, tool_sets, concurrency=concurrency)
        out["hop_ms_p50"] = hop
        out["start_s"] = round(started_s, 1)
        return out
    finally:
        server.stop()


def compare_routers(routers: tuple[str, ...] = ("affinity", "default"), *, requests: int = 120, seed: int = 0,
                    concurrency: int = 6, imbalance: int | None = None, replicas: int = 2,
                    model: str = "tiny") -> dict[str, Any]:
    """The same workload through each router in turn (see the module note); Ray is started
    locally unless this process already joined one."""
    import os

    import ray

    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")     # servers on the loopback
    started = False
    if not ray.is_initialized():
        ray.init(address="local", include_dashboard=False, logging_level="ERROR", log_to_driver=False,
                 namespace="xg2-bench-routing")
        started = True
    try:
        tool_sets = make_workload(requests, seed=seed)
        result: dict[str, Any] = {"config": {"requests": requests, "seed": seed, "concurrency": concurrency,
                                             "imbalance": imbalance, "replicas": replicas, "model": model,
                                             "routers": list(routers)}}
        for router in routers:
            result[router] = run_router(router, tool_sets, concurrency=concurrency, imbalance=imbalance,
                                        replicas=replicas, model=model)
        return result
    finally:
        if started:
            ray.shutdown()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="160 requests (instead of 400)")
    ap.add_argument("--requests", type=int, default=None, help="requests per router (default 400; 160 with --quick)")
    ap.add_argument("--concurrency", type=int, default=6, help="client threads (default 6)")
    ap.add_argument("--routers", default="affinity,default", help="comma-separated: affinity, stateless, default")
    ap.add_argument("--imbalance", type=int, default=None, help="the affinity router's load bound (default: its own)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default=None, help="write the result here too")
    args = ap.parse_args(argv)
    requests = args.requests or (160 if args.quick else 400)
    concurrency = args.concurrency
    routers = tuple(r.strip() for r in args.routers.split(",") if r.strip())
    unknown = [r for r in routers if r not in ROUTERS]
    if unknown:
        ap.error(f"unknown router(s) {unknown}: {', '.join(ROUTERS)}")
    result = compare_routers(routers, requests=requests, seed=args.seed, concurrency=concurrency,
                             imbalance=args.imbalance)
    text = json.dumps(result, indent=2)
    print(text)
    if args.json:
        Path(args.json).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
