"""Where a replica's compiles run, decided by measurement (issue 33): (a) compile workers as Ray actors,
each with its own cache tier, or (b) child processes of the replica whose tier is the replica's own,
reached over their pipe (what xg2.actors.compile_workers does).

    python benchmarks/bench_compile_placement.py [--sets N] [--json FILE]

One local Ray, the tiny model's vocabulary (SmolLM2's), tool sets from ../shared/data/tools. For
each way, on shards of its own: a warming compiler (another replica) compiles tool sets and
publishes them; then the measured one opens
- new-tool sets: 8 tools nobody compiled;
- seen-tool sets: new combinations of 8 tools the warming replica compiled (every module from the
  shards);
and the time to first mask is taken from the request to the grammar ready in the replica's
process with its first mask filled. Both ways deserialize the worker's bytes in the replica and
build the same entries, so what differs is the transport (a pipe, or a Ray call and the object
store) and where the tier is read from. Also: the time a killed worker takes until it compiles
again, and the resident memory of one worker.

(a) is a prototype made here, not shipped: an actor holding a GrammarCompiler bound to a
ShardedCache of its own, called with the spec's bytes, answering the compiled grammar's bytes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
for p in (ROOT, ROOT / "loadtests"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

import workload

SET_TOOLS = 8


def quantile(xs: list[float], q: float) -> float | None:
    return round(float(np.quantile(xs, q)), 2) if xs else None


def _rss_mb(pid: int) -> float:
    import psutil

    return round(psutil.Process(pid).memory_info().rss / 2**20, 1)


class CompileActor:
    """(a): a compile worker as a Ray actor with a tier of its own (as a worker process compiles:
    the first mask's entries, then its bytes with every entry it built)."""

    def __init__(self, info, shard_names: list[str], namespace: str):
        from xg2.actors.router import ShardRouter
        from xg2.actors.tier import ShardedCache
        from xg2.compiler import GrammarCompiler

        self.compiler = GrammarCompiler(info, precompute_budget_ms=0.0, background_precompute=False)
        self.tier = ShardedCache(ShardRouter(shard_names, namespace=namespace, create=False))
        self.tier.bind(self.compiler)

    def compile(self, spec_bytes: bytes) -> tuple[bytes, float, dict]:
        import msgspec

        from xg2.actors.spec import GrammarSpec

        cpu0 = time.process_time()
        before = dict(self.compiler.reuse)
        compiled = msgspec.msgpack.decode(spec_bytes, type=GrammarSpec).compile(self.compiler)
        compiled._precomputed.wait()
        blob = compiled.serialize(all_entries=True)
        meta = {**{k: v - before[k] for k, v in self.compiler.reuse.items()},
                "tier_found": compiled._tier_found, "tier_modules": compiled._tier_modules}
        return blob, time.process_time() - cpu0, meta

    def flush(self) -> bool:
        return self.tier.flush()

    def pid(self) -> int:
        return os.getpid()


class ActorWorkers:
    """(a) behind the interface GrammarRuntime calls its CompileWorkers by (`compile`, `last`), so
    that both ways run under the same runtime: a pool of actors taken in turn."""

    def __init__(self, actors: list):
        import queue
        import threading

        self.actors = actors
        self._idle: queue.SimpleQueue = queue.SimpleQueue()
        for a in actors:
            self._idle.put(a)
        self.last = threading.local()

    def compile(self, spec, timeout: float, background: bool = False, tier=None, publish: bool = True) -> bytes:
        import msgspec
        import ray

        actor = self._idle.get()
        try:
            blob, cpu_s, meta = ray.get(actor.compile.remote(msgspec.msgpack.encode(spec)), timeout=timeout)
        finally:
            self._idle.put(actor)
        self.last.cpu_s, self.last.meta = cpu_s, meta
        return blob

    def close(self) -> None:
        pass


def tool_sets(seed: int, n: int) -> tuple[list[list[dict]], list[list[dict]], list[list[dict]]]:
    """(warm sets, new-tool sets, seen-tool sets): the seen ones recombine the warm sets' tools."""
    tools = [{"type": "function", "function": {k: v for k, v in t["function"].items() if k != "description"}}
             for t in workload.load_registry_tools()]
    rng = random.Random(seed)
    rng.shuffle(tools)
    warm_pool, fresh = tools[:n * SET_TOOLS], tools[n * SET_TOOLS:]
    warm = [warm_pool[i * SET_TOOLS:(i + 1) * SET_TOOLS] for i in range(n)]
    new = [fresh[i * SET_TOOLS:(i + 1) * SET_TOOLS] for i in range(n)]
    seen = [rng.sample(warm_pool, SET_TOOLS) for _ in range(n)]
    return warm, new, seen


def spec_of(tools: list[dict]):
    from xg2.actors.spec import ToolsSpec

    return ToolsSpec(tools=tools, tool_choice="required")


def first_mask(compiled, info) -> None:
    import xg2

    m = xg2.GrammarMatcher(compiled)
    bitmask = xg2.allocate_token_bitmask(1, info.vocab_size)
    m.fill_next_token_bitmask(bitmask, 0)


def _measure(measured, info, new, seen) -> dict:
    from xg2.actors import SessionSpec

    out = {}
    for label, sets in (("new_tools", new), ("seen_tools", seen)):
        times = []
        for tools in sets:
            t0 = time.perf_counter()
            s = asyncio.run(measured.open(SessionSpec(grammar=spec_of(tools), tenant="m")))
            first_mask(s.compiled_grammar, info)
            times.append((time.perf_counter() - t0) * 1e3)
            measured.close(s)
        out[label] = {"p50_ms": quantile(times, 0.5), "p90_ms": quantile(times, 0.9)}
    out["reuse"] = {k: v for k, v in measured.reuse().items() if k.startswith("modules")}
    return out


def _runtime(info, names, namespace, processes: bool):
    from xg2.actors import GrammarRuntime
    from xg2.actors.router import ShardRouter
    from xg2.actors.tier import ShardedCache

    rt = GrammarRuntime(info, compile_processes=processes,
                        cache_tier=ShardedCache(ShardRouter(names, namespace=namespace, create=False)))
    if processes:
        rt.compile_workers.wait_ready()
    return rt


def _warm(warmer, warm) -> None:
    from xg2.actors import SessionSpec

    for tools in warm:
        asyncio.run(warmer.open(SessionSpec(grammar=spec_of(tools), tenant="w")))
    warmer.cache_tier.flush()


def run_processes(info, names, namespace, warm, new, seen) -> dict:
    """(b): two runtimes as replicas have them (compile worker processes, the tier)."""
    from xg2.actors import SessionSpec

    warmer, measured = _runtime(info, names, namespace, True), _runtime(info, names, namespace, True)
    try:
        _warm(warmer, warm)
        out = _measure(measured, info, new, seen)
        workers = measured.compile_workers
        out["worker_rss_mb"] = _rss_mb(workers.pids()[0])
        pid = workers.pids()[0]
        t0 = time.perf_counter()
        os.kill(pid, 9)
        for _ in range(len(workers.pids()) + 1):        # the dead one is found and replaced when next taken
            asyncio.run(measured.open(SessionSpec(grammar=spec_of(new[0][:2] + seen[0][:1]), tenant="k")))
            if pid not in workers.pids():
                break
        out["restart_to_compile_ms"] = round((time.perf_counter() - t0) * 1e3, 1)
        return out
    finally:
        warmer.shutdown()
        measured.shutdown()


def run_actors(info, names, namespace, warm, new, seen) -> dict:
    """(a): the same runtimes, their compiles on a pool of two compile actors each."""
    import msgspec
    import ray

    Actor = ray.remote(num_cpus=0, max_restarts=-1)(CompileActor)
    info_ref = ray.put(info)
    pools = [[Actor.remote(info_ref, names, namespace) for _ in range(2)] for _ in range(2)]
    ray.get([a.pid.remote() for pool in pools for a in pool])
    warmer, measured = _runtime(info, names, namespace, False), _runtime(info, names, namespace, False)
    try:
        for rt, pool in ((warmer, pools[0]), (measured, pools[1])):
            rt.compile_workers = ActorWorkers(pool)
        _warm(warmer, warm)
        ray.get([a.flush.remote() for a in pools[0]])
        out = _measure(measured, info, new, seen)
        pool = pools[1]
        out["worker_rss_mb"] = _rss_mb(ray.get(pool[0].pid.remote()))
        t0 = time.perf_counter()
        ray.kill(pool[0], no_restart=False)
        out["restart_to_compile_ms"] = None
        while time.perf_counter() - t0 < 120:
            try:
                ray.get(pool[0].compile.remote(msgspec.msgpack.encode(spec_of(new[0][:2] + seen[0][:1]))),
                        timeout=60)
                out["restart_to_compile_ms"] = round((time.perf_counter() - t0) * 1e3, 1)
                break
            except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
                time.sleep(0.05)
        return out
    finally:
        warmer.shutdown()
        measured.shutdown()
        for pool in pools:
            for a in pool:
                ray.kill(a, no_restart=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sets", type=int, default=15, help="tool sets of each kind (default 15)")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    import ray

    from serve.model import load_model, tokenizer_info
    from xg2.actors.keeper import ShardKeeper, shard_names

    info = tokenizer_info(load_model("tiny", progress=False))
    ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR", log_to_driver=False, namespace="bench",
             _node_ip_address="127.0.0.1")
    warm, new, seen = tool_sets(args.seed, args.sets)
    out = {"sets": args.sets, "tools_a_set": SET_TOOLS}
    try:
        for label, run in (("process_with_parent_tier", run_processes), ("ray_actor_with_own_tier", run_actors)):
            print(f"{label} ...", file=sys.stderr, flush=True)
            keeper = ShardKeeper(shard_names(2, f"placement-{label}"), "bench", 64 << 20)
            out[label] = run(info, keeper.names, "bench", warm, new, seen)
            for h in keeper._handles:
                ray.kill(h, no_restart=True)
    finally:
        ray.shutdown()
    text = json.dumps(out, indent=2)
    if args.json:
        args.json.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
