"""Multi-tenant tool calling: many requests, each the `anyOf` of 8 tool envelopes, one compiler.

    python benchmarks/bench_multitenant.py [--requests 500] [--tools 8] [--seed 0] [--steps 32]
        [--engines xg2,xg2-jit,xg2-nocache,llguidance,xgrammar] [--xgrammar-requests 30]
        [--json OUT.json] [--plot OUT.png]

Request i is `{"anyOf": [{"type": "object", "properties": {"name": {"const": <tool name>},
"arguments": <tool parameters>}, "required": ["name", "arguments"], "additionalProperties": false},
...]}` over 8 tools drawn uniformly without replacement from ``../shared/data/tools/registry.jsonl``
(seeded; references inside a tool's parameters are rebased to where the tool sits). Every engine
sees the same requests in the same order with one compiler for the whole run, on one thread:

* time to first mask (TTFM): compile + matcher + first bitmask, per request;
* per-token mask time over a seeded walk of up to ``--steps`` tokens per request (at each step a
  random allowed token, a structural one half of the time, so walks reach the tools' arguments);
* for xg2: pool hits / partial hits / misses per request and the cache bytes after it.

Engines: ``xg2`` (no precomputation beyond the first mask: every other entry is taken from the
pool or built on first visit; caches within 32 MB), ``xg2-background`` (the default 40 ms of precomputation, in the
compiler's background thread, as a server overlapping prefill would run it), ``xg2-nocache`` (no
compile cache, no cross-grammar pool, no linking; otherwise as ``xg2``), ``llguidance`` and
``xgrammar`` (the latter on the first ``--xgrammar-requests`` only: it compiles each request in
seconds).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.append(str(HERE.parent))

from engines import DEFAULT_TOKENIZER, Engine, load_vocab, make_engine, percentile

REGISTRY = HERE.parent.parent / "shared" / "data" / "tools" / "registry.jsonl"
STRUCTURAL = frozenset(b'"]},')
#: The byte budget of xg2's caches (compiled grammars, modules and pool entries) in this run.
CACHE_LIMIT = 32 << 20
XG2_CONFIGS = {
    "xg2": {"precompute_budget_ms": 0, "cache_limit_bytes": CACHE_LIMIT},
    "xg2-background": {"background_precompute": True, "cache_limit_bytes": CACHE_LIMIT},
    "xg2-defaults": {"cache_limit_bytes": CACHE_LIMIT},
    "xg2-sync": {"background_precompute": False, "cache_limit_bytes": CACHE_LIMIT},
    "xg2-nocache": {"precompute_budget_ms": 0, "cache_enabled": False, "cross_grammar_cache": False},
}


#: Seconds between a request's first mask and its walk, standing for the model's prefill
#: (bench_ttfm.py --prefill-ms); 0: the walk starts at once.
PREFILL_S = 0.0


def _rebase(node: Any, prefix: str) -> Any:
    if isinstance(node, dict):
        return {k: (prefix + v[1:] if k == "$ref" and isinstance(v, str) and v.startswith("#") else _rebase(v, prefix))
                for k, v in node.items()}
    if isinstance(node, list):
        return [_rebase(x, prefix) for x in node]
    return node


def load_tools() -> list[dict]:
    """The registry's tools (each its OpenAI `function` object), in file order, key order kept."""
    return [json.loads(line)["function"] for line in REGISTRY.open(encoding="utf-8")]


def sample_tools(n: int, per_request: int, seed: int, n_tools: int) -> list[list[int]]:
    """For each of `n` requests, `per_request` distinct tool indices drawn uniformly (seeded)."""
    rng = random.Random(seed)
    return [rng.sample(range(n_tools), per_request) for _ in range(n)]


def make_engine_and_compiler(name: str, vocab) -> tuple[Engine, Any]:
    """The engine for a configuration name (an `XG2_CONFIGS` key, `llguidance[-lenient]`,
    `xgrammar`) and the one compiler all its requests share (None for llguidance, which has none)."""
    if name in XG2_CONFIGS:
        engine = make_engine("xg2", vocab)
        engine.compiler_options = XG2_CONFIGS[name]
        return engine, engine.module.GrammarCompiler(engine.info, max_threads=1, **XG2_CONFIGS[name])
    engine = make_engine(name, vocab)
    return engine, engine.json_compiler()


def make_requests(n: int, per_request: int, seed: int) -> tuple[list[dict], list[list[int]]]:
    tools = load_tools()
    picks = sample_tools(n, per_request, seed, len(tools))
    schemas = []
    for pick in picks:
        branches = []
        for j, k in enumerate(pick):
            params = _rebase(tools[k].get("parameters", {}), f"#/anyOf/{j}/properties/arguments")
            branches.append({"type": "object", "properties": {"name": {"const": tools[k]["name"]},
                                                              "arguments": params},
                             "required": ["name", "arguments"], "additionalProperties": False})
        schemas.append({"anyOf": branches})
    return schemas, picks


def run_engine(name: str, vocab, schemas: list[dict], picks: list[list[int]], steps: int, seed: int,
               token_bytes: list[bytes], stops: set[int], as_text: bool = False) -> dict:
    base = "xg2" if name in XG2_CONFIGS else name
    engine, compiler = make_engine_and_compiler(name, vocab)
    tb = token_bytes
    bitmask = engine.new_bitmask()
    import numpy as np

    rows = []
    seen: set[int] = set()
    for i, schema in enumerate(schemas):
        row: dict[str, Any] = {"i": i, "new_tools": len(set(picks[i]) - seen)}
        seen |= set(picks[i])
        before = compiler.cache_stats() if base == "xg2" else None
        if as_text:     # what an HTTP server receives (written before the clock starts)
            schema = json.dumps(schema)
        t0 = time.perf_counter()
        try:
            handle = engine.compile_json_schema(schema, compiler, **({"lenient": True} if base != "xgrammar" else {}))
            matcher = engine.new_matcher(handle)
            engine.fill(matcher, bitmask)
        except Exception as exc:  # noqa: BLE001 - recorded per request
            row["error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
            rows.append(row)
            continue
        row["ttfm_ms"] = (time.perf_counter() - t0) * 1e3
        if PREFILL_S:
            time.sleep(PREFILL_S)
        rng = random.Random(seed * 1_000_003 + i)
        times = []
        for step in range(steps):
            if step:
                t = time.perf_counter()
                engine.fill(matcher, bitmask)
                times.append((time.perf_counter() - t) * 1e6)
            arr = np.asarray(bitmask).reshape(-1).view(np.uint32)
            allowed = np.nonzero(np.unpackbits(arr.view(np.uint8), bitorder="little"))[0]
            allowed = [int(t) for t in allowed if t < len(tb) and t not in stops and tb[t]]
            if not allowed:
                break
            if rng.random() < 0.5:
                structural = [t for t in allowed if STRUCTURAL & set(tb[t])]
                allowed = structural or allowed
            if not engine.accept(matcher, rng.choice(allowed)):
                row["error"] = f"token rejected at step {step}"
                break
        row["mask_us"] = times
        if base == "xg2":
            after = compiler.cache_stats()
            for k in ("hits", "partial_hits", "misses"):
                row[k] = after[k] - before[k]
            row["cache_bytes"] = compiler.get_cache_size_bytes()
        rows.append(row)
    return {"engine": name, "version": engine.version, "options": XG2_CONFIGS.get(name, engine.json_options),
            "rows": rows}


def summary(result: dict, skip: int) -> dict:
    rows = [r for r in result["rows"] if r["i"] >= skip and "ttfm_ms" in r]
    ttfm = sorted(r["ttfm_ms"] for r in rows)
    masks = sorted(t for r in rows for t in r["mask_us"])
    out = {"engine": result["engine"], "requests": len(rows),
           "errors": sum(1 for r in result["rows"] if "error" in r)}
    if ttfm:
        out.update(ttfm_p50_ms=percentile(ttfm, 0.5), ttfm_p99_ms=percentile(ttfm, 0.99),
                   ttfm_mean_ms=statistics.fmean(ttfm))
    if masks:
        out.update(mask_mean_us=statistics.fmean(masks), mask_p50_us=percentile(masks, 0.5),
                   mask_p99_us=percentile(masks, 0.99), tokens=len(masks))
    if rows and "hits" in rows[0]:
        h = sum(r["hits"] for r in rows)
        p = sum(r["partial_hits"] for r in rows)
        m = sum(r["misses"] for r in rows)
        total = max(1, h + p + m)
        out.update(hit_rate=h / total, partial_rate=p / total, miss_rate=m / total,
                   cache_bytes_last=rows[-1]["cache_bytes"],
                   cache_bytes_max=max(r["cache_bytes"] for r in result["rows"] if "cache_bytes" in r))
    return out


def markdown(summaries: list[dict], skip: int) -> str:
    lines = [(f"| engine | requests (from #{skip}) | TTFM p50 ms | TTFM p99 ms | mask mean µs | mask p99 µs |"
              " hits / partial / misses | cache MB (last) |"),
             "|---|---:|---:|---:|---:|---:|---|---:|"]
    for s in summaries:
        rates = (f"{s['hit_rate']:.1%} / {s['partial_rate']:.1%} / {s['miss_rate']:.1%}"
                 if "hit_rate" in s else "")
        mb = f"{s['cache_bytes_last'] / 2**20:.1f}" if "cache_bytes_last" in s else ""
        lines.append(f"| {s['engine']} | {s['requests']} | {s.get('ttfm_p50_ms', float('nan')):.2f} | "
                     f"{s.get('ttfm_p99_ms', float('nan')):.2f} | {s.get('mask_mean_us', float('nan')):.1f} | "
                     f"{s.get('mask_p99_us', float('nan')):.1f} | {rates} | {mb} |")
    return "\n".join(lines)


def plot(results: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, bx) = plt.subplots(2, 1, figsize=(9, 7), sharex=True, height_ratios=[3, 1])
    for res in results:
        pts = [(r["i"], r["ttfm_ms"]) for r in res["rows"] if "ttfm_ms" in r]
        if pts:
            ax.plot(*zip(*pts), ".", ms=3, label=res["engine"])
        cache = [(r["i"], r["cache_bytes"] / 2**20) for r in res["rows"] if "cache_bytes" in r]
        if cache and res["engine"] == "xg2":
            bx.plot(*zip(*cache), label=f"{res['engine']} cache MB")
    ax.set_yscale("log")
    ax.set_ylabel("time to first mask (ms)")
    ax.axhline(1.0, color="grey", lw=0.5, ls="--")
    ax.axhline(10.0, color="grey", lw=0.5, ls=":")
    ax.legend(loc="upper right", fontsize=8)
    ax.set_title("Each request: anyOf of 8 tool envelopes from the registry (DeepSeek-V3 vocabulary)")
    bx.set_xlabel("request index")
    bx.set_ylabel("cache MB")
    bx.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=500)
    ap.add_argument("--tools", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--skip", type=int, default=100, help="requests left out of the summary (warm-up)")
    ap.add_argument("--engines", default="xg2,xg2-nocache,llguidance,xgrammar")
    ap.add_argument("--xgrammar-requests", type=int, default=30)
    ap.add_argument("--tokenizer", default=str(DEFAULT_TOKENIZER))
    ap.add_argument("--json", type=Path)
    ap.add_argument("--plot", type=Path)
    ap.add_argument("--as-text", action="store_true", help="schemas given as JSON text (what a server receives)")
    args = ap.parse_args()

    vocab = load_vocab(Path(args.tokenizer))
    schemas, picks = make_requests(args.requests, args.tools, args.seed)
    reference = make_engine("xg2", vocab)     # token bytes and stop tokens for every engine's walks
    token_bytes, stops = reference.token_bytes(), set(reference.info.stop_token_ids)
    results = []
    for name in args.engines.split(","):
        n = min(args.requests, args.xgrammar_requests) if name == "xgrammar" else args.requests
        t = time.perf_counter()
        res = run_engine(name, vocab, schemas[:n], picks[:n], args.steps, args.seed, token_bytes, stops,
                         as_text=args.as_text)
        print(f"[{name}] {n} requests in {time.perf_counter() - t:.1f} s", file=sys.stderr)
        results.append(res)
    summaries = [summary(r, min(args.skip, len(r["rows"]) // 2)) for r in results]
    print(markdown(summaries, args.skip))
    if args.json:
        args.json.write_text(json.dumps({"args": vars(args) | {"json": str(args.json), "plot": str(args.plot),
                                                               "tokenizer": args.tokenizer},
                                         "summaries": summaries, "results": results}, indent=1))
    if args.plot:
        plot(results, args.plot)


if __name__ == "__main__":
    main()
