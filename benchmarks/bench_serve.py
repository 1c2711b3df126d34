"""The serving path (serve/): constrained against unconstrained decoding on one engine, and the time
to first token of a request whose tool set another tenant already used against a first-seen one.

    python benchmarks/bench_serve.py [--quick] [--json FILE] [--models tiny,default] [--serve-model tiny]

**A. Constrained vs unconstrained decoding** (in process, no Ray). Per model of ``--models``: one
``Engine(model, stop_token_ids=[], runtime=GrammarRuntime(tokenizer_info(loaded)), max_batch=8)``,
as the replica builds it but without stop tokens (below). The prompts: JSONSchemaBench's JME
subset (json-mode-eval, ``<shared>/data/jsonschemabench/JME.jsonl``), in a seeded order, schemas of
150 to 1,500 bytes (compact JSON); prompt k is the model's chat rendering
(``loaded.chat_format.render``, the replica's) of one user message asking for a JSON object that
follows schema k (the schema written in the message), tokenized as the replica tokenizes
(``add_special_tokens=False``); its grammar is ``JSONSchemaSpec(schema)`` with the defaults the
server uses (any whitespace, strict mode).

The same number of tokens on both sides. Every request asks for ``max_tokens = N`` (``--tokens``;
32 with --quick, 64 otherwise), greedy (temperature 0). The engine has no stop token, so an
unconstrained request always writes N tokens; a constrained one would too unless its grammar
completed (after which it allows only the end of the sequence). So the schemas are chosen by a
pilot run: candidates are run constrained, 8 at a time, on the same engine with the model's stop
tokens put back (``engine.stop_ids``), and a schema is kept only if its request wrote N tokens
without stopping; B = 8 uses the first 8 schemas kept, B = 1 the first. The pilot also compiles
every grammar (and waits for the compiler's background precompute) and builds, along the very path
the timed runs take, the mask entries that are built lazily: compiles and first builds are not in
the per-token figures (time to first token is part B). A timed constrained request that still ends
early (a greedy path that differs from the pilot's) is reported in ``failed`` and its pair
dropped.

A *run* submits the B requests together (one event-loop tick; constrained: each with a fresh session
of its own grammar, opened just before and not timed) and waits for all of them. Per request:
``e2e_ms_per_token`` = (time its last token reached the consumer - its submit) / N, the figure the
bar is about (it holds the prefill, one request at a time between steps, as the engine does it);
``decode_ms_per_token`` = (last token - first token) / (N - 1), the request's decode phase, where the
mask work is a larger share (at B = 8 it still holds the prefills of the requests admitted after it,
one per step). Runs alternate: pair i is (unconstrained, constrained) for even i,
(constrained, unconstrained) for odd i (ABBA, so a drift of the machine's load falls on both
sides), ``--pairs`` pairs after one unmeasured run of each kind (the constrained one is the pilot).
Garbage is collected before each run, not disabled. Figures per (model, B): the medians over all
requests of all runs of a kind, ``ratio`` = constrained median / unconstrained median (and
``pair_ratio``: the median over pairs of the ratio of the pair's medians), and the engine's
per-step figures (``engine.steps``, cleared before each run; the medians over the steps of all runs
of a kind): ``forward_ms`` (launch to logits), ``fill_ms`` (launch to the end of the bitmask fill,
which runs on the loop's thread beside the forward), ``mask_exposed_ms`` (what the step waited for
the mask: applying it, the sessions' accepts, and any wait for a fill that outlasted the forward).
``bar``: ratio <= 1.03 for the default model, <= 1.10 for the tiny one.

The engine's KV cache is grown once to its largest size before the first request
(``engine.lm._room``), so that no run pays for a reallocation.

**B. Time to first token, shared against first-seen tool sets** (through the Serve app:
``serve.cli.Server(model=--serve-model, port=<a free port>, mask_service=False,
api_keys=<a key ring of the two tenants and an admin key>)``, one model replica, 2 cache shards,
the official ``openai`` client). Tool sets: 8 tools each from ``<shared>/data/tools/registry.jsonl``
(OpenAI tool objects) among the 626 whose JSON is at most 200 tokens (so that a prompt fits the
tiny model's 2,048 positions: ~1.2-1.7k tokens), all sets disjoint (no tool in two sets: a
first-seen set is cold for the compiler's per-schema caches too). A request: ``chat.completions.create(messages=[one user message],
tools=<8 tools>, tool_choice="required", max_tokens=--serve-tokens, temperature=0, stream=True)``,
one at a time (each waits for the previous one: TTFT without queueing). After one unmeasured
warm-up request (its own set), tenant A sends M sets (``--serve-sets``; 6 with --quick, 16
otherwise), each first seen by the replica; then tenant B sends, alternately, one of A's sets
(``b_shared``) and a set of its own (``b_first_seen``), M of each. Per request, from the replica's
``GET /v1/xg2/stats`` (read after every request; its ``recent[-1]`` is that request's when the
replica's request count went up by one and the tenant matches, else the request is marked
``unmatched`` and left out):
``compile_ms`` (the session's open: the grammar from the replica's cache, the shards or a compile;
``grammar_from`` says which, as the replica records it),
``first_token_ms`` (submit to first sampled token: prefill of the ~1.2-1.7k-token prompt and the
first mask), ``ttft_ms`` = their sum; and the deltas of the runtime counters around it (``compiles``,
``grammar_hits`` (the replica's own cache), ``tier_grammar_hits`` (the shards), ``compile_shared``).
Client side: ``client_first_chunk_ms`` (send to the first SSE chunk, the role chunk, which the
replica sends once the request is submitted: the session is open) and ``client_total_ms``; the
replica sends a tool call only at the end of its text, so the client's first tool-call chunk is
not a first-token time. --quick serves the tiny model (whose prefill costs milliseconds, so the
grammar's part of the TTFT shows), the full run the default model (prefill ~1-4 s on 2 cores).

Every figure goes to ``--json``; a summary is printed; progress goes to stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import gc
import json
import os
import random
import socket
import statistics
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

SHARED = Path(os.environ.get("XG2_SHARED_DIR") or Path(__file__).resolve().parents[2] / "shared")
JME = SHARED / "data" / "jsonschemabench" / "JME.jsonl"
REGISTRY = SHARED / "data" / "tools" / "registry.jsonl"

BARS = {"default": 1.03, "tiny": 1.10}
SIZES = {
    "quick": {"tokens": 32, "pairs": {"tiny": {1: 60, 8: 40}, "default": {1: 10, 8: 8}}, "serve_model": "tiny",
              "serve_sets": 6, "serve_tokens": 8},
    "full": {"tokens": 64, "pairs": {"tiny": {1: 120, 8: 80}, "default": {1: 30, 8: 20}}, "serve_model": "default",
             "serve_sets": 16, "serve_tokens": 16},
}
PILOT_WIDTH = 8
MAX_TOOL_TOKENS = 200
MAX_PILOT_ROUNDS = 5
USER_JSON = ("Give me an example record as a JSON object that follows this JSON Schema, with realistic "
             "values:\n{schema}")
USER_TOOLS = ("I need help with a task: {task} Use one of the tools.")
TASKS = ["find the latest news about solar power.", "check what is on my calendar tomorrow.",
         "look up the weather in Lisbon.", "summarise the open issues of my project.",
         "convert 120 US dollars to euros.", "get the details of order 4471."]


def log(msg: str) -> None:
    print(f"[bench_serve] {msg}", file=sys.stderr, flush=True)


def median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def pct(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile (None for no values)."""
    v = sorted(values)
    if not v:
        return None
    return v[min(len(v) - 1, max(0, round(q * len(v) + 0.5) - 1))]


# ---------------------------------------------------------------------------------------------- part A


def jme_candidates(seed: int) -> list[dict]:
    with JME.open(encoding="utf-8") as f:
        records = [json.loads(line) for line in f if line.strip()]
    out = []
    for r in records:
        text = json.dumps(r["schema"], separators=(",", ":"), ensure_ascii=False)
        if 150 <= len(text.encode()) <= 1500:
            out.append({"id": r["id"], "schema": r["schema"], "text": text})
    random.Random(seed).shuffle(out)
    return out


async def timed_run(engine: Any, rt: Any, prompts: list[list[int]], specs: list[Any] | None, n: int) -> dict:
    """One run: the requests submitted together, each consumed by its own task; per-request times."""
    from serve.engine import SamplingParams

    sessions = [await rt.open(s) for s in specs] if specs is not None else [None] * len(prompts)
    gc.collect()
    engine.steps.clear()
    params = SamplingParams(max_tokens=n, temperature=0.0)
    gens = [engine.submit(p, params, s) for p, s in zip(prompts, sessions)]

    async def consume(g: Any) -> dict:
        first = last = None
        count = 0
        async for _ in g:
            now = time.perf_counter()
            count += 1
            if first is None:
                first = now
            last = now
        return {"tokens": count, "finish": g.finish_reason, "submitted": g.submitted, "first": first, "last": last}

    try:
        got = await asyncio.gather(*(consume(g) for g in gens), return_exceptions=True)
    finally:
        rt.close([s for s in sessions if s is not None])
    reqs = []
    for r in got:
        if isinstance(r, BaseException):
            reqs.append({"error": f"{type(r).__name__}: {r}"})
            continue
        ok = r["tokens"] == n and r["finish"] == "length"
        reqs.append({"tokens": r["tokens"], "finish": r["finish"], "ok": ok,
                     "e2e_ms_per_token": (r["last"] - r["submitted"]) * 1e3 / max(1, r["tokens"]),
                     "decode_ms_per_token": (r["last"] - r["first"]) * 1e3 / max(1, r["tokens"] - 1)})
    return {"requests": reqs, "steps": [list(s) for s in engine.steps],
            "ok": all(q.get("ok") for q in reqs)}


async def pilot(engine: Any, rt: Any, loaded: Any, cands: list[dict], n: int, need: int,
                render: Any) -> tuple[list[dict], dict]:
    """Candidates run constrained with the model's stop tokens; the first `need` that write n tokens
    without stopping are kept (their grammars compiled, precomputed and warmed on the way)."""
    from xg2.actors.spec import JSONSchemaSpec

    kept: list[dict] = []
    info = {"tried": 0, "rejected": [], "compile_ms": []}
    engine.stop_ids = frozenset(loaded.eos_token_ids)
    try:
        pos = 0
        for _ in range(MAX_PILOT_ROUNDS):
            if len(kept) >= need or pos >= len(cands):
                break
            batch = []
            while len(batch) < PILOT_WIDTH and pos < len(cands):
                c = cands[pos]
                pos += 1
                spec = JSONSchemaSpec(c["schema"])
                t0 = time.perf_counter()
                try:
                    s = await rt.open(spec)
                except Exception as e:      # noqa: BLE001 - a schema the compiler refuses is skipped
                    info["rejected"].append({"id": c["id"], "why": f"compile: {type(e).__name__}: {e}"})
                    continue
                info["compile_ms"].append((time.perf_counter() - t0) * 1e3)
                waiter = getattr(s.compiled_grammar, "_precomputed", None)
                rt.close(s)
                if waiter is not None:
                    await asyncio.to_thread(waiter.wait, 10.0)
                batch.append(dict(c, spec=spec, prompt=render(c)))
            info["tried"] += len(batch)
            run = await timed_run(engine, rt, [c["prompt"] for c in batch], [c["spec"] for c in batch], n)
            for c, r in zip(batch, run["requests"]):
                if r.get("ok"):
                    kept.append(c)
                else:
                    info["rejected"].append({"id": c["id"], "why": r.get("error") or
                                             f"{r['finish']} after {r['tokens']} tokens"})
    finally:
        engine.stop_ids = frozenset()
    return kept[:need], info


def _step_medians(steps: list[list[float]]) -> dict:
    if not steps:
        return {}
    cols = list(zip(*steps))
    return {"steps": len(steps), "forward_ms": median(list(cols[0])), "fill_ms": median(list(cols[1])),
            "mask_exposed_ms": median(list(cols[2])), "mask_exposed_mean_ms": statistics.fmean(cols[2]),
            "mask_exposed_p90_ms": pct(list(cols[2]), 0.9), "batch": median(list(cols[3]))}


async def bench_batch(engine: Any, rt: Any, chosen: list[dict], b: int, n: int, pairs: int, model: str) -> dict:
    prompts = [c["prompt"] for c in chosen[:b]]
    specs = [c["spec"] for c in chosen[:b]]
    warm = await timed_run(engine, rt, prompts, None, n)      # unmeasured (the constrained side: the pilot)
    runs: dict[str, list[dict]] = {"unconstrained": [], "constrained": []}
    failed = []
    pair_ratios: dict[str, list[float]] = {"e2e": [], "decode": []}
    for i in range(pairs):
        order = ("unconstrained", "constrained") if i % 2 == 0 else ("constrained", "unconstrained")
        got = {}
        for kind in order:
            got[kind] = await timed_run(engine, rt, prompts, specs if kind == "constrained" else None, n)
        if not (got["constrained"]["ok"] and got["unconstrained"]["ok"]):
            failed.append({"pair": i, "requests": {k: v["requests"] for k, v in got.items()}})
            log(f"  {model} B={b} pair {i}: a request did not write {n} tokens; pair dropped")
            continue
        for kind in order:
            runs[kind].append(got[kind])
        for fig in ("e2e", "decode"):
            m = {k: median([q[f"{fig}_ms_per_token"] for q in got[k]["requests"]]) for k in got}
            pair_ratios[fig].append(m["constrained"] / m["unconstrained"])
        log(f"  {model} B={b} pair {i + 1}/{pairs}: e2e ratio {pair_ratios['e2e'][-1]:.3f}, "
            f"decode ratio {pair_ratios['decode'][-1]:.3f}")
    out: dict[str, Any] = {"model": model, "batch": b, "tokens": n, "pairs": pairs, "pairs_kept": len(runs["constrained"]),
                           "schemas": [c["id"] for c in chosen[:b]], "prompt_tokens": [len(p) for p in prompts],
                           "failed": failed, "warmup_ok": warm["ok"]}
    for kind, rs in runs.items():
        reqs = [q for r in rs for q in r["requests"]]
        steps = [s for r in rs for s in r["steps"]]
        out[kind] = {"e2e_ms_per_token": median([q["e2e_ms_per_token"] for q in reqs]),
                     "decode_ms_per_token": median([q["decode_ms_per_token"] for q in reqs]),
                     "run_e2e_ms_per_token": [median([q["e2e_ms_per_token"] for q in r["requests"]]) for r in rs],
                     "run_decode_ms_per_token": [median([q["decode_ms_per_token"] for q in r["requests"]])
                                                 for r in rs],
                     "step": _step_medians(steps), "steps_raw_ms": steps}
    if runs["constrained"]:
        c, u = out["constrained"], out["unconstrained"]
        out["ratio"] = c["e2e_ms_per_token"] / u["e2e_ms_per_token"]
        out["decode_ratio"] = c["decode_ms_per_token"] / u["decode_ms_per_token"]
        out["pair_ratio"] = median(pair_ratios["e2e"])
        out["pair_ratio_q1_q3"] = [pct(pair_ratios["e2e"], 0.25), pct(pair_ratios["e2e"], 0.75)]
        out["pair_decode_ratio"] = median(pair_ratios["decode"])
        # the mask time a step waited for, beyond the unconstrained path's, against the forward
        out["exposed_share"] = ((c["step"]["mask_exposed_ms"] - u["step"]["mask_exposed_ms"])
                                / u["step"]["forward_ms"])
        out["pair_ratios"] = pair_ratios
        out["forward_ratio"] = c["step"]["forward_ms"] / u["step"]["forward_ms"]
        out["bar"] = BARS.get(model)
        out["meets_bar"] = None if out["bar"] is None else out["ratio"] <= out["bar"]
    return out


async def bench_model(model: str, cfg: dict, seed: int, batch_sizes: list[int]) -> dict:
    from serve.engine import Engine
    from serve.model import load_model, tokenizer_info
    from xg2.actors import GrammarRuntime

    t0 = time.perf_counter()
    loaded = load_model(model)
    info = tokenizer_info(loaded)
    rt = GrammarRuntime(info)
    engine = Engine(loaded.model, [], runtime=rt, max_batch=max(batch_sizes), vocab_size=loaded.vocab_size)
    n = cfg["tokens"]

    def render(c: dict) -> list[int]:
        text = loaded.chat_format.render([{"role": "user", "content": USER_JSON.format(schema=c["text"])}])
        return loaded.tokenizer.encode(text, add_special_tokens=False)

    cands = jme_candidates(seed)
    longest = max(len(render(c)) for c in cands)
    engine.lm._room(min(engine.lm.max_len, longest + n + 8))       # no reallocation inside a run
    log(f"{model}: loaded in {time.perf_counter() - t0:.1f} s; pilot over {len(cands)} JME schemas")
    need = max(batch_sizes)
    try:
        chosen, pinfo = await pilot(engine, rt, loaded, cands, n, need, render)
        log(f"{model}: pilot kept {len(chosen)} of {pinfo['tried']} ({time.perf_counter() - t0:.1f} s)")
        if len(chosen) < need:
            raise RuntimeError(f"{model}: only {len(chosen)} schemas write {n} tokens without completing")
        res: dict[str, Any] = {"model": model, "vocab_size": loaded.vocab_size, "pilot": pinfo, "batches": {}}
        for b in batch_sizes:
            tb = time.perf_counter()
            r = await bench_batch(engine, rt, chosen, b, n, cfg["pairs"][model][b], model)
            r["wall_s"] = time.perf_counter() - tb
            res["batches"][str(b)] = r
            if "ratio" in r:
                log(f"{model} B={b}: e2e ratio {r['ratio']:.3f}, decode ratio {r['decode_ratio']:.3f}, "
                    f"exposed {r['constrained']['step']['mask_exposed_ms']:.3f} ms/step ({r['wall_s']:.0f} s)")
        res["wall_s"] = time.perf_counter() - t0
        return res
    finally:
        await engine.close()
        rt.shutdown()


# ---------------------------------------------------------------------------------------------- part B


def tool_sets(count: int, seed: int, tokenizer: Any) -> list[list[dict]]:
    """`count` disjoint sets of 8 registry tools (OpenAI tool objects) of at most MAX_TOOL_TOKENS
    tokens each (as JSON), so that a prompt fits the tiny model's 2,048 positions."""
    with REGISTRY.open(encoding="utf-8") as f:
        tools = [{"type": "function", "function": json.loads(line)["function"]} for line in f if line.strip()]
    tools = [t for t in tools if len(tokenizer.encode(json.dumps(t, ensure_ascii=False), add_special_tokens=False))
             <= MAX_TOOL_TOKENS]
    picks = random.Random(seed + 1).sample(range(len(tools)), 8 * count)
    return [[tools[k] for k in picks[8 * i:8 * i + 8]] for i in range(count)]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


#: The benchmark's keys (serve/keys.py): its two tenants, and the admin key it reads the figures with.
KEYS = {"tenant-a": "bench-tenant-a-0123456789", "tenant-b": "bench-tenant-b-0123456789"}
ADMIN_KEY = "bench-operator-0123456789"


def get_stats(url: str) -> dict:
    request = urllib.request.Request(f"{url}/xg2/stats", headers={"Authorization": f"Bearer {ADMIN_KEY}"})
    with urllib.request.urlopen(request, timeout=30) as r:
        return json.loads(r.read())


COUNTERS = ("compiles", "grammar_hits", "tier_grammar_hits", "compile_shared")


def one_request(client: Any, url: str, tenant: str, tools: list[dict], task: str, max_tokens: int,
                before: dict) -> dict:
    t0 = time.perf_counter()
    first = None
    chunks = 0
    error = None
    try:
        stream = client.chat.completions.create(
            model="xg2", messages=[{"role": "user", "content": USER_TOOLS.format(task=task)}], tools=tools,
            tool_choice="required", max_tokens=max_tokens, temperature=0, stream=True)
        for _chunk in stream:
            if first is None:
                first = time.perf_counter()
            chunks += 1
    except Exception as e:      # noqa: BLE001 - recorded with the request
        error = f"{type(e).__name__}: {e}"
    t1 = time.perf_counter()
    after = get_stats(url)
    rec = after["recent"][-1] if after.get("recent") else {}
    matched = (after["requests"]["requests"] == before["requests"]["requests"] + 1 and rec.get("tenant") == tenant)
    out: dict[str, Any] = {"client_first_chunk_ms": None if first is None else (first - t0) * 1e3,
                           "client_total_ms": (t1 - t0) * 1e3, "chunks": chunks, "error": error}
    out["counters"] = {k: after["runtime"].get(k, 0) - before["runtime"].get(k, 0) for k in COUNTERS}
    out["unmatched"] = error is None and not matched
    if error is None and matched:
        out.update(tenant=rec.get("tenant"), grammar_from=rec.get("grammar_from"), prompt_tokens=rec.get("prompt_tokens"),
                   completion_tokens=rec.get("completion_tokens"), compile_ms=rec.get("compile_ms"),
                   first_token_ms=rec.get("ttft_ms"))
        if rec.get("ttft_ms") is not None:
            out["ttft_ms"] = rec["compile_ms"] + rec["ttft_ms"]
    out["_stats"] = after
    return out


def summarize_group(reqs: list[dict]) -> dict:
    ok = [r for r in reqs if r.get("ttft_ms") is not None]
    out: dict[str, Any] = {"n": len(reqs), "ok": len(ok), "errors": sum(1 for r in reqs if r["error"]),
                           "unmatched": sum(1 for r in reqs if r["unmatched"])}
    for key in ("ttft_ms", "compile_ms", "first_token_ms", "client_first_chunk_ms", "client_total_ms"):
        vals = [r[key] for r in ok if r.get(key) is not None]
        out[key] = {"p50": median(vals), "p90": pct(vals, 0.9), "max": max(vals) if vals else None}
    out["counters"] = {k: sum(r["counters"][k] for r in reqs) for k in COUNTERS}
    out["grammar_from"] = {}
    for r in ok:
        where = r.get("grammar_from") or "?"
        out["grammar_from"][where] = out["grammar_from"].get(where, 0) + 1
    out["prompt_tokens_p50"] = median([r["prompt_tokens"] for r in ok if r.get("prompt_tokens")])
    return out


def bench_serve(model: str, sets: int, max_tokens: int, seed: int, port: int | None) -> dict:
    import openai

    from serve.cli import Server
    from serve.model import load_model

    port = port or free_port()
    all_sets = tool_sets(2 * sets + 1, seed, load_model(model, progress=False).tokenizer)
    warm, a_sets, b_new = all_sets[0], all_sets[1:sets + 1], all_sets[sets + 1:]
    t0 = time.perf_counter()
    from serve.keys import KeyRing

    server = Server(model=model, port=port, mask_service=False, progress=False,
                    api_keys=KeyRing([(k, t, False) for t, k in KEYS.items()] + [(ADMIN_KEY, "operator", True)]))
    log(f"serve: starting the app ({model}) on port {port}")
    with server:
        url = server.url
        start_s = time.perf_counter() - t0
        log(f"serve: up in {start_s:.1f} s")
        ca = openai.OpenAI(base_url=url, api_key=KEYS["tenant-a"], max_retries=0, timeout=300)
        cb = openai.OpenAI(base_url=url, api_key=KEYS["tenant-b"], max_retries=0, timeout=300)
        stats = get_stats(url)
        groups: dict[str, list[dict]] = {"warmup": [], "a_first_seen": [], "b_shared": [], "b_first_seen": []}

        def send(group: str, tenant: str, client: Any, tools: list[dict], i: int) -> None:
            nonlocal stats
            r = one_request(client, url, tenant, tools, TASKS[i % len(TASKS)], max_tokens, stats)
            stats = r.pop("_stats")
            r["set"] = i
            groups[group].append(r)
            log(f"  {group} #{i}: ttft {r.get('ttft_ms') or float('nan'):.1f} ms (compile "
                f"{r.get('compile_ms') or float('nan'):.1f}, first token {r.get('first_token_ms') or float('nan'):.1f})"
                f" from {r.get('grammar_from')} {r['counters']}" + (f" ERROR {r['error']}" if r["error"] else ""))

        send("warmup", "tenant-a", ca, warm, 0)
        for i, tools in enumerate(a_sets):
            send("a_first_seen", "tenant-a", ca, tools, i)
        for i in range(sets):
            send("b_shared", "tenant-b", cb, a_sets[i], i)
            send("b_first_seen", "tenant-b", cb, b_new[i], i)
        final = stats
    out = {"model": model, "sets": sets, "max_tokens": max_tokens, "startup_s": start_s,
           "groups": {g: summarize_group(rs) for g, rs in groups.items()}, "requests": groups,
           "final_stats": {k: final.get(k) for k in ("requests", "engine", "steps", "runtime", "cache_bytes",
                                                     "compiler", "tier")},
           "wall_s": time.perf_counter() - t0}
    sh, fs = out["groups"]["b_shared"]["ttft_ms"]["p50"], out["groups"]["b_first_seen"]["ttft_ms"]["p50"]
    out["ttft_ratio"] = fs / sh if sh and fs else None
    return out


# ---------------------------------------------------------------------------------------------- report


def _f(x: Any, spec: str = ".2f") -> str:
    return "-" if x is None else format(x, spec)


def summary(res: dict) -> str:
    head = (f"A. constrained vs unconstrained decoding: {res['config']['tokens']} tokens per request, greedy, "
            "medians per request (ms per output token)")
    cols = (f"{'model':8} {'B':>2} {'pairs':>5} {'e2e U':>8} {'e2e C':>8} {'ratio':>6} {'pair ratio [q1, q3]':>20} "
            f"{'bar':>5} {'ok':>3} {'dec U':>7} {'dec C':>7} {'ratio':>6} {'fwd U':>7} {'fwd C':>7} {'fill':>6} "
            f"{'exposed':>8} {'share':>6}")
    lines = [head, cols] if res.get("part_a") else []
    for m in res.get("part_a", {}).values():
        for r in m["batches"].values():
            if "ratio" not in r:
                lines.append(f"{r['model']:8} {r['batch']:>2} no pair kept")
                continue
            u, c = r["unconstrained"], r["constrained"]
            q1, q3 = r["pair_ratio_q1_q3"]
            pr = f"{r['pair_ratio']:.3f} [{q1:.3f}, {q3:.3f}]"
            lines.append(
                f"{r['model']:8} {r['batch']:>2} {r['pairs_kept']:>5} {u['e2e_ms_per_token']:8.2f} "
                f"{c['e2e_ms_per_token']:8.2f} {r['ratio']:6.3f} {pr:>20} {r['bar']:5.2f} "
                f"{'yes' if r['meets_bar'] else 'NO':>3} {u['decode_ms_per_token']:7.2f} "
                f"{c['decode_ms_per_token']:7.2f} {r['decode_ratio']:6.3f} {u['step']['forward_ms']:7.2f} "
                f"{c['step']['forward_ms']:7.2f} {c['step']['fill_ms']:6.3f} {c['step']['mask_exposed_ms']:8.3f} "
                f"{100 * r['exposed_share']:5.2f}%")
    if res.get("part_a"):
        lines.append("(ms per output token. e2e: submit to last token / N, ratio = constrained / unconstrained of "
                     "the medians over all requests; pair ratio: median over ABBA pairs; dec: first to last token / "
                     "(N-1); fwd: forward ms per step; fill: ms from the forward's launch to the fill's end (hidden); "
                     "exposed: mask ms per step not hidden; share: (exposed C - exposed U) / fwd U)")
    b = res.get("part_b")
    if b and "groups" in b:
        head = (f"B. time to first token through the Serve app ({b['model']} model, 8 tools per request, "
                f"{b['sets']} sets per group, one request at a time), ms")
        cols = (f"{'group':14} {'n':>3} {'ttft p50':>9} {'p90':>8} {'compile p50':>12} {'1st tok p50':>12} "
                f"{'client 1st chunk':>17} {'compiles':>8} {'hits':>5} {'shard hits':>10} {'prompt tok':>10}  grammar from")
        lines += ["", head, cols]
        for g, s in b["groups"].items():
            lines.append(f"{g:14} {s['ok']:>3} {_f(s['ttft_ms']['p50'], '9.1f')} {_f(s['ttft_ms']['p90'], '8.1f')} "
                         f"{_f(s['compile_ms']['p50'], '12.2f')} {_f(s['first_token_ms']['p50'], '12.1f')} "
                         f"{_f(s['client_first_chunk_ms']['p50'], '17.1f')} {s['counters']['compiles']:>8} "
                         f"{s['counters']['grammar_hits']:>5} {s['counters']['tier_grammar_hits']:>10} "
                         f"{_f(s['prompt_tokens_p50'], '10.0f')}  "
                         + ", ".join(f"{k} {v}" for k, v in s["grammar_from"].items()))
        lines.append(f"first-seen / shared TTFT p50: {_f(b['ttft_ratio'], '.2f')}; startup {b['startup_s']:.0f} s")
        lines.append(f"runtime: {json.dumps(b['final_stats'].get('runtime'))}")
        if b["final_stats"].get("tier"):
            lines.append(f"tier: {json.dumps(b['final_stats']['tier'])}")
    elif b:
        lines += ["", f"B. error: {b.get('error')}"]
    lines.append(f"\nwall time {res['wall_s']:.0f} s; load average (1, 5, 15 min) at the start "
                 f"{', '.join(f'{x:.2f}' for x in res['loadavg_start'])}, at the end "
                 f"{', '.join(f'{x:.2f}' for x in res['loadavg_end'])}")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="smaller sizes (under 8 minutes on 2 cores)")
    ap.add_argument("--json", type=Path, help="write the results here")
    ap.add_argument("--models", default="tiny,default", help="part A's models (comma-separated)")
    ap.add_argument("--batch-sizes", default="1,8", help="part A's batch sizes (at most 8)")
    ap.add_argument("--tokens", type=int, help="part A's tokens per request (default 32 quick, 64 full)")
    ap.add_argument("--pairs", type=int, help="part A's (unconstrained, constrained) pairs per model and batch "
                    "(default, B = 1 / 8: quick tiny 60 / 40, default 10 / 8; full tiny 120 / 80, default 30 / 20)")
    ap.add_argument("--serve-model", help="part B's model (default: tiny with --quick, default otherwise)")
    ap.add_argument("--serve-sets", type=int, help="part B's tool sets per group (default 6 quick, 16 full)")
    ap.add_argument("--serve-tokens", type=int, help="part B's max_tokens (default 8 quick, 16 full)")
    ap.add_argument("--port", type=int, help="part B's port (default: a free one)")
    ap.add_argument("--no-serve", action="store_true", help="skip part B")
    ap.add_argument("--no-engine", action="store_true", help="skip part A")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    for path in (JME, REGISTRY):
        if not path.exists():
            ap.error(f"{path} not found (the shared data lives beside the checkout, or set XG2_SHARED_DIR)")
    cfg = copy.deepcopy(SIZES["quick" if args.quick else "full"])
    models = [m for m in args.models.split(",") if m]
    batch_sizes = [int(b) for b in args.batch_sizes.split(",") if b]
    if any(not 1 <= b <= PILOT_WIDTH for b in batch_sizes):
        ap.error(f"batch sizes must be within 1..{PILOT_WIDTH}")
    if args.tokens is not None:
        cfg["tokens"] = args.tokens
    if cfg["tokens"] < 2:
        ap.error("--tokens must be at least 2")
    for m in models:
        per_b = cfg["pairs"].setdefault(m, dict(cfg["pairs"]["default"]))
        for b in batch_sizes:
            per_b[b] = args.pairs if args.pairs is not None else per_b.get(b, per_b[8])
    cfg["serve_model"] = args.serve_model or cfg["serve_model"]
    cfg["serve_sets"] = args.serve_sets or cfg["serve_sets"]
    cfg["serve_tokens"] = args.serve_tokens or cfg["serve_tokens"]

    import torch

    t_start = time.perf_counter()
    res: dict[str, Any] = {"args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
                           "config": cfg, "torch_threads": torch.get_num_threads(), "cpus": os.cpu_count(),
                           "part_a": {}, "loadavg_start": os.getloadavg()}
    if not args.no_engine:
        for m in models:
            res["part_a"][m] = asyncio.run(bench_model(m, cfg, args.seed, batch_sizes))
            gc.collect()
    if not args.no_serve:
        try:
            res["part_b"] = bench_serve(cfg["serve_model"], cfg["serve_sets"], cfg["serve_tokens"], args.seed,
                                        args.port)
        except Exception as e:      # noqa: BLE001 - part A's figures are still reported
            log(f"serve: failed: {type(e).__name__}: {e}")
            res["part_b"] = {"error": f"{type(e).__name__}: {e}"}
    res["wall_s"] = time.perf_counter() - t_start
    res["loadavg_end"] = os.getloadavg()
    print(summary(res))
    if args.json:
        args.json.write_text(json.dumps(res, indent=1, ensure_ascii=False, default=str))


if __name__ == "__main__":
    main()
