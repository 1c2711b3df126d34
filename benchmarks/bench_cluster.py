"""Tenants' tool sets reusing sub-structures across replicas and nodes, on a real Ray cluster (issue 33).

    python benchmarks/bench_cluster.py [--quick] [--json FILE] [--seed N]

A Ray cluster of a head and two worker nodes is started on this machine (ray.cluster_utils.Cluster:
each node its own raylet and resources), and `xg2 serve`'s application is deployed on it the way
`xg2 serve --address` deploys it (serve.cli.Server, defaults but the model: the tiny one), with one
model replica per worker node and the cache shards spread over the nodes by their keeper.

The workload: tool sets of 4-32 tools drawn from `../shared/data/tools/registry.jsonl` with Zipf
popularity (a few tools in many sets, most in few), so that most sets are new as a whole and their
tools are not; tool_choice required, auto and named, as the load tests send them; and JSON Schema
requests (jsonschemabench, Zipf). Requests go over HTTP, four at a time, through Serve's proxy;
each response says where its grammar came from and what its compile found where (the
X-XG2-Grammar header: local, joined, shards or compiled; modules and first-mask entries found in
the process, read from the shards, or built), and the bench reads nothing else from the server
for the figures but /v1/xg2/stats (compile CPU).

Then probes, one at a time: sets of 8 tools never sent before ("new tools"), and new combinations
of 8 tools that only one replica answered in the workload ("seen tools"; those whose every tool
came from the shards, lowered on another node, give ttfm_seen_tools_*). The affinity router sends
such a set to the replica that holds its tools, so the seen-tools figures come from the run with
Serve's default router (the same compile path, the probes placed at random), with the new-tools
figures of that run beside them; the affinity run's are under `ttfm_affinity`. TTFM here is the
replica's time from the request's arrival to its grammar session with the first mask's entries
built (the fill itself is microseconds).

The same workload runs three times on fresh applications: the defaults (affinity routing, the
cache tier), Serve's default router, and the tier off (`compile_cpu_ms_per_request_unshared`).
During the first, a worker node's raylet is killed mid-run and a new node added: its replica and
shards are replaced; requests are retried by the client as an OpenAI client would (connection
errors, 5xx, 429), and masks are compared again after recovery.

`masks_identical`: for a sample of the grammars sent, masks read through the mask service (whose
compiles read and feed the same shards) along a walk equal those of one in-process reference
compiler that shares nothing.
"""

from __future__ import annotations

import os

# Ray reads this when it is first imported: every node and driver of the cluster on the loopback
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
os.environ.setdefault("RAY_SERVE_PROXY_HEALTH_CHECK_PERIOD_S", "2")

import argparse
import asyncio
import json
import math
import random
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
for p in (ROOT, ROOT / "loadtests"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

import run  # loadtests/run.py: quantiles, a free port
import workload

#: Prompt budget of a tool set for the tiny model (estimated tokens; see workload.ToolPool).
TOOLS_BUDGET_TOKENS = 1700
PROBE_TOOLS = 8
LOOPBACK = "127.0.0.1"
#: API keys the workload's requests take in turn (each its own tenant, as the load tests' are).
TENANTS = 8
RETRIES = 4


def quantile(xs: list[float], q: float) -> float | None:
    v = run.quantile(xs, q)
    return None if v is None else round(v, 2)


# ------------------------------------------------------------------------------------------------
# The workload
# ------------------------------------------------------------------------------------------------

class Workload:
    """Requests drawn from a seed: the same sequence for every configuration. The tenants' tools
    come from a catalogue of `catalogue` registry tools with Zipf popularity (many tenants use the
    same popular tools, in sets of their own); the probes' new tools are registry tools whose
    parameter schemas no catalogue tool has (a schema is what is lowered: two tools with the same
    parameters share a module)."""

    def __init__(self, seed: int, catalogue: int = 150):
        tools = [{"type": "function", "function": {k: v for k, v in t["function"].items() if k != "description"}}
                 for t in workload.load_registry_tools()]
        rng = random.Random(f"cluster/{seed}")
        rng.shuffle(tools)
        self.tools = tools[:catalogue]
        taken = {json.dumps(t["function"].get("parameters"), sort_keys=True) for t in self.tools}
        self.held_out = []
        for t in tools[catalogue:]:
            text = json.dumps(t["function"].get("parameters"), sort_keys=True)
            if text not in taken:
                taken.add(text)
                self.held_out.append(t)
        self.costs = [workload.estimate_tokens(json.dumps(t, ensure_ascii=False)) + 1 for t in self.tools]
        self.popularity = workload.ZipfIndex(len(self.tools), 1.0)
        self.schemas = workload.SchemaPool(seed=seed, limit=300).schemas
        self.schema_popularity = workload.ZipfIndex(len(self.schemas), 1.1)

    def tool_set(self, rng: random.Random) -> list[dict]:
        want = round(math.exp(rng.uniform(math.log(4), math.log(32.49))))
        picked: dict[int, None] = {}
        cost = 0
        for _ in range(20 * want):
            if len(picked) >= want:
                break
            j = self.popularity.draw(rng)
            if j not in picked and cost + self.costs[j] <= TOOLS_BUDGET_TOKENS:
                picked[j] = None
                cost += self.costs[j]
        return [self.tools[j] for j in picked]

    def requests(self, n: int, seed: int) -> list[dict]:
        rng = random.Random(f"requests/{seed}")
        out = []
        for i in range(n):
            tenant = f"tenant-{i % TENANTS}"
            if rng.random() < 0.75:
                tools = self.tool_set(rng)
                choice = ("required", "auto", "named")[i % 3]
                tc: Any = choice if choice != "named" else {
                    "type": "function", "function": {"name": tools[0]["function"]["name"]}}
                out.append({"kind": "tools", "n_tools": len(tools), "tenant": tenant, "body": {
                    "model": "tiny", "messages": [{"role": "user", "content": "Call a tool."}], "tools": tools,
                    "tool_choice": tc, "max_tokens": 12, "seed": i}})
            else:
                s = self.schemas[self.schema_popularity.draw(rng)]
                out.append({"kind": "json", "n_tools": 0, "tenant": tenant, "body": {
                    "model": "tiny", "messages": [{"role": "user", "content": "Answer in JSON."}],
                    "response_format": {"type": "json_schema", "json_schema": {"name": "answer", "schema": s.schema}},
                    "max_tokens": 12, "seed": i}})
        return out

    def probes(self, n: int, pools: list[list[dict]], seed: int) -> list[dict]:
        """n pairs: a set of never-sent tools, then a new combination of sent ones, all from one of
        `pools` in turn (the tools only one replica compiled: see seen_on_one_replica)."""
        rng = random.Random(f"probes/{seed}")
        fresh = list(self.held_out)
        pools = [p for p in pools if p]
        out = []
        for i in range(n):
            new = [fresh.pop() for _ in range(min(PROBE_TOOLS, len(fresh)))]
            pool = pools[i % len(pools)] if pools else []
            old = rng.sample(pool, min(PROBE_TOOLS, len(pool)))
            for kind, tools in (("new_tools", new), ("seen_tools", old)):
                if tools:
                    out.append({"kind": kind, "n_tools": len(tools), "tenant": f"prober-{i}", "body": {
                        "model": "tiny", "messages": [{"role": "user", "content": "Call a tool."}], "tools": tools,
                        "tool_choice": "required", "max_tokens": 4, "seed": 1000 + i}})
        return out


# ------------------------------------------------------------------------------------------------
# The client
# ------------------------------------------------------------------------------------------------

async def send(session: Any, url: str, req: dict, t0: float) -> dict:
    """One request, retried as an OpenAI client retries (connection errors, 429, 5xx)."""
    import aiohttp

    rec = {"kind": req["kind"], "n_tools": req["n_tools"], "t": time.monotonic() - t0, "attempts": 0, "req": req}
    body = json.dumps(req["body"]).encode()
    start = time.perf_counter()
    for attempt in range(RETRIES):
        rec["attempts"] = attempt + 1
        try:
            async with session.post(url + "/chat/completions", data=body, headers={
                    "Authorization": f"Bearer {req.get('tenant', 'bench')}", "Content-Type": "application/json"}) as r:
                await r.read()
                rec["status"] = r.status
                info = r.headers.get("x-xg2-grammar")
                rec["info"] = json.loads(info) if info else None
                if r.status != 429 and r.status < 500:
                    break
        except (aiohttp.ClientError, asyncio.TimeoutError) as e:
            rec["status"], rec["error"] = None, f"{type(e).__name__}: {e}"[:200]
        await asyncio.sleep(0.5 * 2 ** attempt)
    rec["ms"] = round((time.perf_counter() - start) * 1e3, 2)
    return rec


async def run_requests(url: str, reqs: list[dict], concurrency: int, t0: float,
                       on_progress: Any = None) -> list[dict]:
    import aiohttp

    queue: asyncio.Queue = asyncio.Queue()
    for r in reqs:
        queue.put_nowait(r)
    out: list[dict] = []
    timeout = aiohttp.ClientTimeout(total=120)

    async def worker(session: Any) -> None:
        while not queue.empty():
            req = queue.get_nowait()
            out.append(await send(session, url, req, t0))
            if on_progress is not None:
                await on_progress(len(out))

    async with aiohttp.ClientSession(timeout=timeout) as session:
        await asyncio.gather(*(worker(session) for _ in range(concurrency)))
    return out


def replica_stats(url: str, want: int, tries: int = 40) -> dict[str, dict]:
    """/v1/xg2/stats of every model replica (each answer is one replica's: asked until `want` are seen)."""
    import urllib.request

    seen: dict[str, dict] = {}
    for _ in range(tries):
        request = urllib.request.Request(url + "/xg2/stats", headers={"Authorization": "Bearer bench-cluster"})
        with urllib.request.urlopen(request, timeout=10) as r:
            stats = json.loads(r.read())
        seen[stats["replica"]["id"]] = stats
        if len(seen) >= want:
            break
    return seen


# ------------------------------------------------------------------------------------------------
# Figures
# ------------------------------------------------------------------------------------------------

def reuse_figures(recs: list[dict]) -> dict:
    compiled = [r["info"] for r in recs if r.get("info") and r["info"]["from"] == "compiled"]
    mods = sum(i.get("modules_local", 0) + i.get("modules_shards", 0) + i.get("modules_lowered", 0) for i in compiled)
    found = sum(i.get("modules_local", 0) + i.get("modules_shards", 0) for i in compiled)
    need = sum(i.get("entries_needed", 0) for i in compiled)
    got = sum(i.get("entries_local", 0) + i.get("entries_shards", 0) for i in compiled)
    infos = [r["info"] for r in recs if r.get("info")]
    hits = sum(1 for i in infos if i["from"] in ("local", "joined", "shards"))
    return {"module_hit_rate": round(found / mods, 3) if mods else None,
            "entry_hit_rate": round(got / need, 3) if need else None,
            "grammar_hit_rate": round(hits / len(infos), 3) if infos else None,
            "modules": mods, "modules_from_shards": sum(i.get("modules_shards", 0) for i in compiled)}


def compiled_tools(req: dict) -> list[dict]:
    """The tools whose schemas a request's grammar holds (a named tool_choice: that tool only)."""
    body = req["body"]
    choice = body.get("tool_choice")
    if isinstance(choice, dict):
        return [t for t in body["tools"] if t["function"]["name"] == choice["function"]["name"]]
    return body["tools"]


def local_hit_rate(recs: list[dict]) -> float | None:
    """Of the tool requests, the share of what they needed that the answering replica held: the
    whole grammar (1), else the share of its tools' modules found in the process."""
    xs = []
    for r in recs:
        i = r.get("info")
        if r["kind"] != "tools" or not i:
            continue
        if i["from"] in ("local", "joined"):
            xs.append(1.0)
        elif i["from"] == "compiled":
            n = i.get("modules_local", 0) + i.get("modules_shards", 0) + i.get("modules_lowered", 0)
            xs.append(i.get("modules_local", 0) / n if n else 0.0)
        else:
            xs.append(0.0)
    return round(sum(xs) / len(xs), 3) if xs else None


def seen_on_one_replica(recs: list[dict]) -> list[list[dict]]:
    """Per replica, the tools of the run's tool requests whose parameter schemas it alone compiled
    (a module is a schema's: two tools with the same parameters share it), one tool per schema: a
    new combination of them sent to the other replica finds every module in the shards, lowered on
    another node."""
    holders: dict[str, set] = {}
    tool_of: dict[str, dict] = {}
    for r in recs:
        if r["kind"] != "tools" or not r.get("info") or "replica" not in r["info"]:
            continue
        for t in compiled_tools(r["req"]):
            k = json.dumps(t["function"].get("parameters"), sort_keys=True)
            tool_of.setdefault(k, t)
            holders.setdefault(k, set()).add(r["info"]["replica"])
    pools: dict[str, list[dict]] = {}
    for k, replicas in holders.items():
        if len(replicas) == 1:
            pools.setdefault(next(iter(replicas)), []).append(tool_of[k])
    return [pools[r] for r in sorted(pools)]


def ttfm(probes: list[dict]) -> dict:
    def ready(pred):
        return [r["info"]["ready_ms"] for r in probes if r.get("info") and r["info"]["from"] == "compiled" and pred(r)]

    def lowered(r):
        return r["info"].get("modules_lowered", 0)

    new = ready(lambda r: r["kind"] == "new_tools" and r["info"].get("modules_local", 0) == 0
                and r["info"].get("modules_shards", 0) == 0 and lowered(r) > 0)
    seen_shards = ready(lambda r: r["kind"] == "seen_tools" and lowered(r) == 0 and r["info"].get("modules_local", 0) == 0)
    seen_any = ready(lambda r: r["kind"] == "seen_tools" and lowered(r) == 0)
    return {"ttfm_seen_tools_p50_ms": quantile(seen_shards, 0.5), "ttfm_seen_tools_p99_ms": quantile(seen_shards, 0.99),
            "ttfm_seen_tools_n": len(seen_shards), "ttfm_seen_tools_any_p50_ms": quantile(seen_any, 0.5),
            "ttfm_seen_tools_any_n": len(seen_any),
            "ttfm_new_tools_p50_ms": quantile(new, 0.5), "ttfm_new_tools_p99_ms": quantile(new, 0.99),
            "ttfm_new_tools_n": len(new)}


def compile_cpu_per_request(stats: dict[str, dict]) -> float | None:
    cpu = sum((s.get("reuse") or {}).get("compile_cpu_ms", 0) for s in stats.values())
    opens = sum((s.get("reuse") or {}).get("grammar_opens", 0) for s in stats.values())
    return round(cpu / opens, 2) if opens else None


# ------------------------------------------------------------------------------------------------
# Masks
# ------------------------------------------------------------------------------------------------

async def masks_check(bodies: list[dict], info: Any, seed: int, steps: int = 24) -> dict:
    """Walk each body's grammar with a reference compiler; the mask service (on the cluster, fed by
    the shards) must give every mask of the walk."""
    import msgspec
    import numpy as np
    from ray import serve

    import xg2
    from serve import protocol as p
    from serve.grammars import chat_session_spec
    from xg2.actors.spec import SessionSpec

    handle = serve.get_app_handle("xg2-masks")
    reference = xg2.GrammarCompiler(info, cross_grammar_cache=False, cache_enabled=False)
    rng = random.Random(f"masks/{seed}")
    checked = wrong = failed = 0
    errors: list[str] = []
    for body in bodies:
        spec = chat_session_spec(p.decode_chat_request(json.dumps(body).encode()), tool_format="qwen_3")
        if spec is None:
            continue
        try:
            ref = xg2.GrammarMatcher(spec.compile(reference))
        except xg2.XG2Error:
            continue
        try:
            opened = await asyncio.wait_for(handle.open.remote(
                "bench-masks", msgspec.to_builtins(SessionSpec(grammar=spec)), True), 120)
        except Exception as e:      # noqa: BLE001 - counted
            failed += 1
            errors.append(f"{type(e).__name__}: {e}"[:200])
            continue
        sid, got = opened["session"], opened["mask"]
        try:
            for _ in range(steps):
                want = xg2.allocate_token_bitmask(1, info.vocab_size).numpy()
                ref.fill_next_token_bitmask(want, 0)
                checked += 1
                if not np.array_equal(np.asarray(got).reshape(-1), want.reshape(-1)):
                    wrong += 1
                    break
                allowed = np.flatnonzero(np.unpackbits(want.view(np.uint8), bitorder="little")[:info.vocab_size])
                token = int(rng.choice(allowed))
                if not ref.accept_token(token) or ref.is_terminated():
                    break
                out = await asyncio.wait_for(handle.step_rows.remote("bench-masks", [sid], [token]), 60)
                if out["accepted"] != [True]:
                    wrong += 1
                    break
                got = out["masks"][0]
        except Exception as e:      # noqa: BLE001 - counted
            failed += 1
            errors.append(f"{type(e).__name__}: {e}"[:200])
        finally:
            await handle.close.remote("bench-masks", [sid])
    return {"masks_checked": checked, "wrong_masks": wrong, "mask_calls_failed": failed, "errors": errors[:3]}


# ------------------------------------------------------------------------------------------------
# The cluster and the application
# ------------------------------------------------------------------------------------------------

def start_cluster() -> Any:
    from ray.cluster_utils import Cluster

    # every node on the loopback (Ray takes the machine's address otherwise)
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False,
                                                            "node_ip_address": LOOPBACK})
    for _ in range(2):
        cluster.add_node(num_cpus=1, resources={"xg2_model": 1}, node_ip_address=LOOPBACK)
    cluster.wait_for_nodes()
    return cluster


def deploy(cluster: Any, port: int, *, tier: bool, router: str | None) -> Any:
    from serve.cli import Server

    options: dict[str, Any] = {}
    if router is not None:
        options["router"] = router
    server = Server(address=cluster.address, model="tiny", port=port, replicas=2, shards=4 if tier else 0,
                    progress=False, options=options, proxy_location="HeadOnly",
                    model_placement={"resources": {"xg2_model": 0.01}, "max_replicas_per_node": 1})
    return server.start()


def model_replicas_running() -> int:
    from ray import serve

    app = serve.status().applications.get("xg2")
    if app is None:
        return 0
    return sum(d.replica_states.get("RUNNING", 0) for name, d in app.deployments.items() if name == "xg2-model")


async def kill_phase(cluster: Any, url: str, reqs: list[dict], t0: float, stats: dict[str, dict]) -> tuple[list[dict], dict]:
    """Requests four at a time; a third of the way in, the raylet of the node of one model replica
    is killed and a new worker node added; recovered: both model replicas running again and a
    request answered by a replica not seen before the kill."""
    nodes = {s["replica"]["node"] for s in stats.values()}
    victim = next(n for n in cluster.worker_nodes if n.node_id in nodes)
    killed: dict[str, Any] = {}
    seen_before: set[str] = set()

    async def progress(done: int) -> None:
        if not killed and done >= len(reqs) // 3:
            killed["t"] = time.monotonic()
            cluster.remove_node(victim, allow_graceful=False)
            cluster.add_node(num_cpus=1, resources={"xg2_model": 1}, node_ip_address=LOOPBACK)

    recs = await run_requests(url, reqs, 4, t0, progress)
    for r in recs:
        if r.get("info") and killed and r["t"] + t0 < killed["t"]:
            seen_before.add(r["info"]["replica"])
    recovered = None
    deadline = killed["t"] + 120
    probe_rng = random.Random(1)
    while time.monotonic() < deadline:
        if model_replicas_running() >= 2:
            extra = await run_requests(url, [{"kind": "recovery", "n_tools": 0, "body": {
                "model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2,
                "seed": probe_rng.randrange(1 << 30)}}] * 4, 4, t0)
            recs_replicas = {r["info"]["replica"] for r in extra if r.get("info")}
            if recs_replicas - seen_before or any(r.get("status") == 200 for r in extra):
                recovered = round(time.monotonic() - killed["t"], 1)
                break
        await asyncio.sleep(0.5)
    failed = sum(1 for r in recs if r.get("status") not in (200, 400))
    return recs, {"failed_requests": failed, "recovered_s": recovered, "retried": sum(r["attempts"] - 1 for r in recs)}


# ------------------------------------------------------------------------------------------------

async def one_config(cluster: Any, w: Workload, *, n: int, probes: int, tier: bool, router: str | None,
                     kill: bool, info: Any, seed: int, mask_sample: int) -> dict:
    port = run.free_port()
    t_deploy = time.monotonic()
    server = deploy(cluster, port, tier=tier, router=router)
    url = server.url
    out: dict[str, Any] = {"deploy_s": round(time.monotonic() - t_deploy, 1)}
    try:
        t0 = time.monotonic()
        reqs = w.requests(n, seed)
        recs = await run_requests(url, reqs, 4, t0)
        third = [r for r in recs if r["t"] >= (max(x["t"] for x in recs) / 3)]
        probe_recs = await run_requests(url, w.probes(probes, seen_on_one_replica(recs), seed), 1, t0)
        out.update({"requests": len(recs) + len(probe_recs),
                    "failed_requests": sum(1 for r in recs + probe_recs if r.get("status") not in (200, 400)),
                    "refused_400": sum(1 for r in recs + probe_recs if r.get("status") == 400),
                    "whole_run": reuse_figures(recs), **reuse_figures(third), **ttfm(probe_recs),
                    "local_hit_rate": local_hit_rate(recs),
                    "latency_p50_ms": quantile([r["ms"] for r in recs], 0.5)})
        stats = replica_stats(url, 2)
        out["compile_cpu_ms_per_request"] = compile_cpu_per_request(stats)
        out["replicas_seen"] = len(stats)
        out["replica_nodes"] = sorted({s["replica"]["node"][:8] for s in stats.values()})
        print(json.dumps({k: v for k, v in out.items() if k != "whole_run"}), file=sys.stderr, flush=True)
        if mask_sample:
            sample = [q["body"] for q in reqs[:: max(1, len(reqs) // mask_sample)]][:mask_sample]
            out["masks"] = await masks_check(sample, info, seed)
        if kill:
            krecs, kill_out = await kill_phase(cluster, url, w.requests(max(24, n // 2), seed + 1), t0, stats)
            after = await masks_check([q["body"] for q in w.requests(6, seed + 2)], info, seed + 2)
            out["node_kill"] = {**kill_out, "wrong_masks": after["wrong_masks"],
                                "masks_checked_after": after["masks_checked"],
                                "mask_calls_failed_after": after["mask_calls_failed"], "requests": len(krecs)}
    finally:
        server.stop()
    return out


async def main_async(args: argparse.Namespace) -> dict:
    import ray

    from serve.model import load_model, tokenizer_info

    info = tokenizer_info(load_model("tiny"))
    w = Workload(args.seed)
    n = 90 if args.quick else 240
    probes = 10 if args.quick else 30
    cluster = start_cluster()
    ray.init(address=cluster.address, namespace="xg2", logging_level="ERROR", log_to_driver=False)
    try:
        nodes = len([n for n in ray.nodes() if n["Alive"]])
        main = await one_config(cluster, w, n=n, probes=probes, tier=True, router=None, kill=True, info=info,
                                seed=args.seed, mask_sample=12 if args.quick else 40)
        default = await one_config(cluster, w, n=n, probes=2 * probes, tier=True, router="default", kill=False,
                                   info=info, seed=args.seed, mask_sample=0)
        unshared = await one_config(cluster, w, n=n, probes=probes, tier=False, router=None, kill=False, info=info,
                                    seed=args.seed, mask_sample=0)
    finally:
        ray.shutdown()
        cluster.shutdown()
    masks = main.get("masks", {})
    return {
        "nodes": nodes, "replicas": main["replicas_seen"], "requests": main["requests"],
        "failed_requests": main["failed_requests"],
        "grammar_hit_rate": main["grammar_hit_rate"], "module_hit_rate": main["module_hit_rate"],
        "entry_hit_rate": main["entry_hit_rate"],
        # A set whose every tool another node lowered reaches a replica that never saw them only
        # when the router does not look at tools: probes sent the same way under both routers,
        # the figures taken where they occur (Serve's default router); the affinity run's too.
        **{k: default[k] for k in default if k.startswith("ttfm_")},
        "ttfm_affinity": {k: main[k] for k in main if k.startswith("ttfm_")},
        "compile_cpu_ms_per_request": main["compile_cpu_ms_per_request"],
        "compile_cpu_ms_per_request_unshared": unshared["compile_cpu_ms_per_request"],
        "routing": {"affinity": {"local_hit_rate": main["local_hit_rate"]},
                    "default": {"local_hit_rate": default["local_hit_rate"]}},
        "masks_identical": bool(masks.get("masks_checked")) and masks.get("wrong_masks", 1) == 0
        and masks.get("mask_calls_failed", 1) == 0,
        "masks": masks,
        "node_kill": main.get("node_kill"),
        "configs": {"default_options": main, "default_router": default, "tier_off": unshared},
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="90 requests and 10 probe pairs a configuration")
    ap.add_argument("--json", type=Path, help="write the figures here")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    out = asyncio.run(main_async(args))
    text = json.dumps(out, indent=2)
    if args.json:
        args.json.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
